import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { isGatewayRestart, parseChannelsUrl, ResumeLedger, withSince } from '../src/resume';
import type { FrameSummary } from '../src/wire';

const URL_A = 'ws://127.0.0.1:8888/lab-base/api/kernels/k-1/channels?session_id=s-1&token=t';
const TARGET_A = { kernelId: 'k-1', sessionId: 's-1' };

const marked = (seq: number, channel = 'iopub'): FrameSummary => ({
  channel,
  mark: { seq, firstSeq: seq }
});

describe('parseChannelsUrl', () => {
  it('finds the kernel and session of a channels URL under any base URL', () => {
    assert.deepEqual(parseChannelsUrl(URL_A), TARGET_A);
    assert.deepEqual(
      parseChannelsUrl('wss://host/user/x/api/kernels/a%2Fb/channels?session_id=s%20t'),
      { kernelId: 'a/b', sessionId: 's t' }
    );
  });

  it('ignores other sockets and channels URLs without a session', () => {
    assert.equal(parseChannelsUrl('ws://h/terminals/websocket/1'), null);
    assert.equal(parseChannelsUrl('ws://h/api/events/subscribe'), null);
    assert.equal(parseChannelsUrl('ws://h/api/kernels/k/channels'), null);
    assert.equal(parseChannelsUrl('ws://h/api/kernels/k/channels/more?session_id=s'), null);
    assert.equal(parseChannelsUrl('not a url'), null);
  });
});

describe('withSince', () => {
  it('adds since and keeps every other parameter', () => {
    const url = new URL(withSince(URL_A, 41));
    assert.equal(url.searchParams.get('since'), '41');
    assert.equal(url.searchParams.get('session_id'), 's-1');
    assert.equal(url.searchParams.get('token'), 't');
    assert.equal(url.pathname, '/lab-base/api/kernels/k-1/channels');
  });

  it('keeps a since the URL already has', () => {
    assert.equal(withSince(`${URL_A}&since=3`, 41), `${URL_A}&since=3`);
  });
});

describe('ResumeLedger', () => {
  it('opens a first socket as asked, and a later one from the last seq received', () => {
    const ledger = new ResumeLedger();
    assert.equal(ledger.urlFor(URL_A), URL_A);
    ledger.opened(TARGET_A);
    assert.ok(ledger.admit(TARGET_A, marked(10)));
    assert.ok(ledger.admit(TARGET_A, marked(12)));
    assert.equal(new URL(ledger.urlFor(URL_A)).searchParams.get('since'), '12');
  });

  it('keeps pairs apart: another session or kernel starts fresh', () => {
    const ledger = new ResumeLedger();
    ledger.admit(TARGET_A, marked(10));
    const otherSession = URL_A.replace('s-1', 's-2');
    const otherKernel = URL_A.replace('k-1', 'k-2');
    assert.equal(ledger.urlFor(otherSession), otherSession);
    assert.equal(ledger.urlFor(otherKernel), otherKernel);
    assert.ok(ledger.admit({ kernelId: 'k-1', sessionId: 's-2' }, marked(3)));
  });

  it('drops IOPub messages at or below the last seq, once delivered', () => {
    const ledger = new ResumeLedger();
    const delivered = [5, 6, 7, 6, 7, 8, 3, 9].filter(seq => ledger.admit(TARGET_A, marked(seq)));
    assert.deepEqual(delivered, [5, 6, 7, 8, 9]);
    assert.equal(ledger.lastSeq(TARGET_A), 9);
  });

  it('drops an IOPub message whose msg_id was delivered, under a new seq too', () => {
    // A gateway killed after it sent seq 7 (msg "b") to this page, before it made it
    // durable, numbers on past a gap when it starts again, and the kernel of its launcher
    // publishes "b" again: seq 12.
    const ledger = new ResumeLedger();
    const frames: Array<[number, string]> = [[6, 'a'], [7, 'b'], [12, 'b'], [13, 'c']];
    const delivered = frames.filter(([seq, msgId]) =>
      ledger.admit(TARGET_A, { ...marked(seq), msgId })
    );
    assert.deepEqual(delivered, [[6, 'a'], [7, 'b'], [13, 'c']]);
    assert.equal(ledger.lastSeq(TARGET_A), 13);
    // Per pair: another session of the kernel gets its own copy.
    assert.ok(ledger.admit({ kernelId: 'k-1', sessionId: 's-2' }, { ...marked(12), msgId: 'b' }));
  });

  it('remembers the newest msg_ids only', () => {
    const ledger = new ResumeLedger();
    const most = ResumeLedger.rememberedIds;
    for (let seq = 1; seq <= most + 1; seq++) {
      assert.ok(ledger.admit(TARGET_A, { ...marked(seq), msgId: `m${seq}` }));
    }
    // m1 was forgotten (the oldest), m2 is still known.
    assert.ok(ledger.admit(TARGET_A, { ...marked(most + 2), msgId: 'm1' }));
    assert.ok(!ledger.admit(TARGET_A, { ...marked(most + 3), msgId: 'm3' }));
  });

  it('delivers everything without a seq: replies, unmarked IOPub', () => {
    const ledger = new ResumeLedger();
    ledger.admit(TARGET_A, marked(50));
    assert.ok(ledger.admit(TARGET_A, { channel: 'shell', mark: null }));
    assert.ok(ledger.admit(TARGET_A, { channel: 'iopub', mark: null }));
    assert.ok(ledger.admit(TARGET_A, { channel: null, mark: null }));
    // A mark on another channel is not the gateway's: it is delivered, not counted.
    assert.ok(ledger.admit(TARGET_A, marked(10, 'shell')));
    assert.equal(ledger.lastSeq(TARGET_A), 50);
  });

  it('gives up since after sockets in a row fail before opening, until one opens', () => {
    const ledger = new ResumeLedger();
    ledger.admit(TARGET_A, marked(20));
    for (let i = 0; i < ResumeLedger.maxFailuresWithSince - 1; i++) {
      ledger.failedBeforeOpen(TARGET_A);
      assert.match(ledger.urlFor(URL_A), /since=20/);
    }
    ledger.failedBeforeOpen(TARGET_A);
    assert.equal(ledger.urlFor(URL_A), URL_A);
    ledger.opened(TARGET_A);
    assert.match(ledger.urlFor(URL_A), /since=20/);
    // Deduplication holds meanwhile.
    assert.equal(ledger.admit(TARGET_A, marked(20)), false);
  });
});

describe('isGatewayRestart', () => {
  it('is a 1001 close whose JSON reason is gateway_shutdown', () => {
    assert.ok(isGatewayRestart(1001, '{"reason":"gateway_shutdown","last_seq":9}'));
    assert.equal(isGatewayRestart(1001, '{"reason":"kernel_shutdown","last_seq":9}'), false);
    assert.equal(isGatewayRestart(1000, '{"reason":"gateway_shutdown"}'), false);
    assert.equal(isGatewayRestart(1001, 'gateway_shutdown'), false);
    assert.equal(isGatewayRestart(1001, ''), false);
  });
});
