import assert from 'node:assert/strict';
import { beforeEach, describe, it } from 'node:test';

import { ResumeLedger } from '../src/resume';
import { resumingWebSocket } from '../src/socket';
import { V1_PROTOCOL } from '../src/wire';
import { iopub, type Message, v1Frame } from './frames';

/** A browser-like WebSocket: `on<type>` attributes are accessors on the prototype. */
class FakeWebSocket extends EventTarget {
  static made: FakeWebSocket[] = [];

  constructor(url: string | URL, protocols?: string | string[]) {
    super();
    this.url = String(url);
    this.protocols = protocols;
    FakeWebSocket.made.push(this);
  }

  readonly url: string;
  readonly protocols: string | string[] | undefined;
  protocol = '';
  binaryType = 'blob';

  open(protocol = V1_PROTOCOL): void {
    this.protocol = protocol;
    this.dispatchEvent(new Event('open'));
  }

  receive(message: Message): void {
    this.dispatchEvent(new MessageEvent('message', { data: v1Frame(message) }));
  }

  closeWith(code: number, reason = ''): void {
    this.dispatchEvent(Object.assign(new Event('close'), { code, reason, wasClean: true }));
  }
}

for (const type of ['open', 'message', 'close', 'error']) {
  const handlers = new WeakMap<object, EventListener>();
  Object.defineProperty(FakeWebSocket.prototype, `on${type}`, {
    configurable: true,
    get(this: FakeWebSocket) {
      return handlers.get(this) ?? null;
    },
    set(this: FakeWebSocket, handler: EventListener | null) {
      const old = handlers.get(this);
      if (old) {
        this.removeEventListener(type, old);
      }
      if (handler) {
        handlers.set(this, handler);
        this.addEventListener(type, handler);
      } else {
        handlers.delete(this);
      }
    }
  });
}

const URL_A = 'ws://127.0.0.1:8888/api/kernels/k-1/channels?session_id=s-1';
const line = (seq: number) => iopub('stream', { name: 'stdout', text: `${seq}\n` }, 'e', seq);
const seqOf = (event: Event) =>
  new TextDecoder().decode((event as MessageEvent).data).match(/"text":"(\d+)/)?.[1];

describe('resumingWebSocket', () => {
  let Socket: typeof WebSocket;

  beforeEach(() => {
    FakeWebSocket.made = [];
    Socket = resumingWebSocket(FakeWebSocket as unknown as typeof WebSocket, new ResumeLedger());
  });

  const open = (url = URL_A) => {
    const socket = new Socket(url, [V1_PROTOCOL]);
    const fake = FakeWebSocket.made[FakeWebSocket.made.length - 1];
    return { socket, fake };
  };

  it('resumes a reconnect of the same session from the last seq, and shows nothing twice', () => {
    const first = open();
    const seen: string[] = [];
    first.socket.onmessage = event => seen.push(`handler ${seqOf(event)}`);
    first.fake.open();
    first.fake.receive(line(1));
    first.fake.receive(line(2));
    first.fake.closeWith(1006);
    assert.equal(first.fake.url, URL_A);

    const second = open();
    assert.equal(new URL(second.fake.url).searchParams.get('since'), '2');
    second.socket.onmessage = event => seen.push(`handler ${seqOf(event)}`);
    const listener = (event: Event) => seen.push(`listener ${seqOf(event)}`);
    second.socket.addEventListener('message', listener);
    second.fake.open();
    second.fake.receive(line(2)); // overlaps what the first socket delivered
    second.fake.receive(line(3));
    second.socket.removeEventListener('message', listener);
    second.fake.receive(line(4));
    assert.deepEqual(seen, [
      'handler 1',
      'handler 2',
      'handler 3',
      'listener 3',
      'handler 4'
    ]);
  });

  it('reads the handler back as set, and delivers shell replies always', () => {
    const { socket, fake } = open();
    const handler = () => undefined;
    socket.onmessage = handler;
    assert.equal(socket.onmessage, handler);
    const seen: string[] = [];
    socket.onmessage = event => seen.push(new TextDecoder().decode((event as MessageEvent).data));
    fake.open();
    fake.receive(line(5));
    fake.receive({ ...line(5), channel: 'shell' });
    assert.equal(seen.length, 2);
    socket.onmessage = null;
    fake.receive(line(6));
    assert.equal(seen.length, 2);
  });

  it('reports a gateway stop as a service restart, and a kernel shutdown as it is', () => {
    const codes: number[] = [];
    const stopped = open();
    stopped.socket.onclose = event => codes.push(event.code);
    stopped.socket.addEventListener('close', event => codes.push(event.code));
    stopped.fake.open();
    stopped.fake.closeWith(1001, '{"reason":"gateway_shutdown","last_seq":7}');
    const ended = open();
    ended.socket.onclose = event => codes.push(event.code);
    ended.fake.open();
    ended.fake.closeWith(1001, '{"reason":"kernel_shutdown","last_seq":7}');
    assert.deepEqual(codes, [1012, 1012, 1001]);
  });

  it('leaves other sockets to the browser', () => {
    const { socket, fake } = open('ws://127.0.0.1:8888/terminals/websocket/1');
    assert.equal(Object.getOwnPropertyDescriptor(socket, 'onmessage'), undefined);
    const seen: number[] = [];
    socket.onmessage = () => seen.push(1);
    fake.receive(line(1));
    fake.receive(line(1));
    assert.deepEqual(seen, [1, 1]);
  });

  it('goes without since after repeated failures to open, and back once one opens', () => {
    const first = open();
    first.socket.onmessage = () => undefined; // a seq counts once delivered
    first.fake.open();
    first.fake.receive(line(9));
    first.fake.closeWith(1006);
    for (let attempt = 0; attempt < ResumeLedger.maxFailuresWithSince; attempt++) {
      const failing = open();
      assert.match(failing.fake.url, /since=9/);
      failing.fake.closeWith(1006);
    }
    const fallback = open();
    assert.equal(fallback.fake.url, URL_A);
    fallback.fake.open();
    fallback.fake.closeWith(1006);
    assert.match(open().fake.url, /since=9/);
  });
});
