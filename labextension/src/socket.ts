/**
 * The WebSocket class JupyterLab's server settings hand to every service: the browser's
 * own, plus exact resume for kernel channels sockets (see ./resume.ts for the rules).
 *
 * JupyterLab's kernel connection creates its socket with `new settings.WebSocket(url,
 * protocols)`, then sets `binaryType`, `onmessage`, `onopen`, `onclose` and `onerror`.
 * For a channels URL this class
 *
 * - opens `url` with `&since=<last seq>` when the (kernel, session) pair was seen before;
 * - hides from `onmessage` and from `message` listeners each IOPub message already
 *   received (one decision per event, whatever the number of listeners);
 * - reports a gateway's own stop (close 1001, `gateway_shutdown`) as 1012, "service
 *   restart", so that JupyterLab reconnects instead of giving up.
 *
 * Any other URL (terminals, the event bus, other extensions' sockets) gets the browser's
 * WebSocket behaviour untouched.
 */

import {
  type ChannelsTarget,
  isGatewayRestart,
  parseChannelsUrl,
  ResumeLedger,
  SERVICE_RESTART
} from './resume';
import { summarizeFrame } from './wire';

/**
 * A WebSocket class resuming kernel channels through `ledger`.
 *
 * @param Base - The WebSocket class to extend (the browser's `WebSocket`).
 * @param ledger - Shared by every socket of the page, so that a reconnect finds what
 *   the socket before it received.
 */
export function resumingWebSocket(
  Base: typeof WebSocket,
  ledger: ResumeLedger
): typeof WebSocket {
  class ResumingWebSocket extends Base {
    constructor(url: string | URL, protocols?: string | string[]) {
      const given = String(url);
      super(ledger.urlFor(given), protocols);
      const target = parseChannelsUrl(given);
      if (target !== null) {
        Private.install(this, Base, target, ledger);
      }
    }
  }
  return ResumingWebSocket;
}

namespace Private {
  type Handler = ((this: WebSocket, event: Event) => unknown) | null;
  type Wrapped = (event: Event) => void;

  /** Wrap the socket's message and close delivery, and note when it opens. */
  export function install(
    socket: WebSocket,
    Base: typeof WebSocket,
    target: ChannelsTarget,
    ledger: ResumeLedger
  ): void {
    const nativeAdd = Base.prototype.addEventListener;
    const nativeRemove = Base.prototype.removeEventListener;
    const admitted = new WeakMap<Event, boolean>();
    const reported = new WeakMap<Event, Event>();

    // The event each listener and handler is given, or null to withhold it.
    const deliver = (event: Event): Event | null => {
      if (event.type === 'message') {
        let admit = admitted.get(event);
        if (admit === undefined) {
          const frame = summarizeFrame((event as MessageEvent).data, socket.protocol);
          admit = ledger.admit(target, frame);
          admitted.set(event, admit);
        }
        return admit ? event : null;
      }
      if (event.type === 'close') {
        let shown = reported.get(event);
        if (shown === undefined) {
          const close = event as CloseEvent;
          shown = isGatewayRestart(close.code, close.reason)
            ? restartEvent(close)
            : event;
          reported.set(event, shown);
        }
        return shown;
      }
      return event;
    };

    const wrap = (listener: EventListenerOrEventListenerObject): Wrapped => {
      return (event: Event) => {
        const shown = deliver(event);
        if (shown === null) {
          return;
        }
        if (typeof listener === 'function') {
          listener.call(socket, shown);
        } else {
          listener.handleEvent(shown);
        }
      };
    };

    let opened = false;
    nativeAdd.call(socket, 'open', () => {
      opened = true;
      ledger.opened(target);
    });
    nativeAdd.call(socket, 'close', () => {
      if (!opened) {
        ledger.failedBeforeOpen(target);
      }
    });

    for (const type of ['message', 'close']) {
      const property = `on${type}`;
      const native = findSetter(Base.prototype, property);
      if (native === undefined) {
        continue;
      }
      let handler: Handler = null;
      Object.defineProperty(socket, property, {
        configurable: true,
        enumerable: true,
        get: () => handler,
        set: (value: Handler) => {
          handler = typeof value === 'function' ? value : null;
          native.call(socket, handler === null ? null : wrap(handler));
        }
      });
    }

    const wrappers = new Map<string, WeakMap<object, Wrapped>>();
    socket.addEventListener = ((
      type: string,
      listener: EventListenerOrEventListenerObject | null,
      options?: boolean | AddEventListenerOptions
    ) => {
      if (listener === null) {
        return;
      }
      if (type !== 'message' && type !== 'close') {
        nativeAdd.call(socket, type, listener, options);
        return;
      }
      let byListener = wrappers.get(type);
      if (byListener === undefined) {
        byListener = new WeakMap();
        wrappers.set(type, byListener);
      }
      let wrapped = byListener.get(listener);
      if (wrapped === undefined) {
        wrapped = wrap(listener);
        byListener.set(listener, wrapped);
      }
      nativeAdd.call(socket, type, wrapped, options);
    }) as WebSocket['addEventListener'];
    socket.removeEventListener = ((
      type: string,
      listener: EventListenerOrEventListenerObject | null,
      options?: boolean | EventListenerOptions
    ) => {
      if (listener === null) {
        return;
      }
      const wrapped = wrappers.get(type)?.get(listener);
      nativeRemove.call(socket, type, wrapped ?? listener, options);
    }) as WebSocket['removeEventListener'];
  }

  function findSetter(
    prototype: object | null,
    property: string
  ): ((value: unknown) => void) | undefined {
    for (let proto = prototype; proto !== null; proto = Object.getPrototypeOf(proto)) {
      const descriptor = Object.getOwnPropertyDescriptor(proto, property);
      if (descriptor !== undefined) {
        return descriptor.set;
      }
    }
    return undefined;
  }

  /** The close event JupyterLab is shown for a gateway's stop: code 1012. */
  function restartEvent(close: CloseEvent): Event {
    const init = { code: SERVICE_RESTART, reason: close.reason, wasClean: close.wasClean };
    if (typeof CloseEvent === 'function') {
      return new CloseEvent('close', init);
    }
    return Object.assign(new Event('close'), init);
  }
}
