import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { type Fetch, isKernelModelRequest, type Patience, patientFetch } from '../src/patience';

/** A clock that moves only when the fetch sleeps. */
function manualPatience(limit = 10_000): Patience & { slept: number[] } {
  let now = 0;
  const slept: number[] = [];
  return {
    interval: 1000,
    limit,
    now: () => now,
    sleep: async ms => {
      slept.push(ms);
      now += ms;
    },
    slept
  };
}

/** A server down for `downFor` tries, then up; the requests it got. */
function server(downFor: number): { fetch: Fetch; urls: string[] } {
  const urls: string[] = [];
  return {
    urls,
    fetch: async input => {
      urls.push(typeof input === 'object' && 'url' in input ? input.url : String(input));
      if (urls.length <= downFor) {
        throw new TypeError('Failed to fetch');
      }
      return new Response('{}', { status: 200 });
    }
  };
}

const MODEL = 'http://127.0.0.1:8888/lab/api/kernels/0f7c?1712345678';

describe('isKernelModelRequest', () => {
  it("is a GET of one kernel's model, and nothing else", () => {
    assert.equal(isKernelModelRequest(MODEL), true);
    assert.equal(isKernelModelRequest(new Request(MODEL)), true);
    assert.equal(isKernelModelRequest(MODEL, { method: 'DELETE' }), false);
    assert.equal(isKernelModelRequest(new Request(MODEL, { method: 'POST' })), false);
    assert.equal(isKernelModelRequest('http://h/api/kernels'), false);
    assert.equal(isKernelModelRequest('http://h/api/kernels/0f7c/interrupt'), false);
    assert.equal(isKernelModelRequest('http://h/api/sessions/0f7c'), false);
  });
});

describe('patientFetch', () => {
  it("asks for a kernel's model again each second until the server answers", async () => {
    const up = server(4);
    const patience = manualPatience();
    const response = await patientFetch(up.fetch, patience)(new Request(MODEL));
    assert.equal(response.status, 200);
    assert.equal(up.urls.length, 5);
    assert.deepEqual(patience.slept, [1000, 1000, 1000, 1000]);
  });

  it('lets the error through once its patience is over', async () => {
    const down = server(1000);
    const patience = manualPatience(3000);
    await assert.rejects(patientFetch(down.fetch, patience)(MODEL), TypeError);
    assert.equal(down.urls.length, 4);
  });

  it('asks again on a 404 from a server that was just out of reach', async () => {
    let tries = 0;
    const comingBack: Fetch = async () => {
      tries += 1;
      if (tries <= 2) {
        throw new TypeError('Failed to fetch');
      }
      return new Response('', { status: tries <= 4 ? 404 : 200 });
    };
    const patience = manualPatience();
    assert.equal((await patientFetch(comingBack, patience)(MODEL)).status, 200);
    assert.equal(tries, 5);
    const gone: Fetch = async () => {
      tries += 1;
      if (tries <= 6) {
        throw new TypeError('Failed to fetch');
      }
      return new Response('', { status: 404 });
    };
    const limited = manualPatience(5000);
    assert.equal((await patientFetch(gone, limited)(MODEL)).status, 404, 'within its limit');
  });

  it('gives an HTTP answer back as it came, and other requests one try', async () => {
    const answers: Fetch = async () => new Response('', { status: 404 });
    assert.equal((await patientFetch(answers, manualPatience())(MODEL)).status, 404);
    const down = server(1000);
    const patience = manualPatience();
    await assert.rejects(patientFetch(down.fetch, patience)('http://h/api/kernels'), TypeError);
    await assert.rejects(
      patientFetch(down.fetch, patience)(MODEL, { method: 'DELETE' }),
      TypeError
    );
    assert.equal(down.urls.length, 2);
    assert.deepEqual(patience.slept, []);
  });

  it('stops at once when the request is aborted', async () => {
    const down = server(1000);
    const controller = new AbortController();
    controller.abort();
    const patience = manualPatience();
    await assert.rejects(
      patientFetch(down.fetch, patience)(MODEL, { signal: controller.signal }),
      TypeError
    );
    assert.equal(down.urls.length, 1);
  });
});
