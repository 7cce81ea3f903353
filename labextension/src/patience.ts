/**
 * The `fetch` JupyterLab's server settings hand to every service: the browser's own, and
 * for the one request a dropped kernel connection waits on, patience.
 *
 * When a kernel's socket fails to open (the server is down: a gateway restart), JupyterLab
 * asks the server for the kernel's model (`GET /api/kernels/<id>`) before it opens another
 * socket; on a network error it asks again only 10 to 30 s later. A page whose gateway was
 * back after a few seconds went on showing nothing for up to half a minute more. This
 * `fetch` answers that request once the server does: on a network error it asks again
 * every second, for up to a minute, then lets the error through (JupyterLab then waits
 * its 10 to 30 s and asks again, and the next minute of asking starts). A server that has
 * just come back may not know the kernel yet (it is being re-attached): a 404 that follows
 * a network error is asked again too, within the same minute, before it goes back (each
 * answer that JupyterLab gets, 404 or not, costs it one of its seven tries to reconnect).
 * Any other answer goes back as it came; every other request is the browser's `fetch`
 * unchanged.
 */

/** What a `fetch` is called with here, and gives. */
export type Fetch = (input: RequestInfo | URL, init?: RequestInit) => Promise<Response>;

/** How long to wait between tries, and how long at most; how to wait (tests their own). */
export interface Patience {
  interval: number;
  limit: number;
  now: () => number;
  sleep: (ms: number) => Promise<void>;
}

export const DEFAULT_PATIENCE: Patience = {
  interval: 1000,
  limit: 60_000,
  now: () => Date.now(),
  sleep: ms => new Promise(resolve => setTimeout(resolve, ms))
};

const KERNEL_MODEL = /\/api\/kernels\/[^/]+\/?$/;

/** Whether a request is a `GET` of one kernel's model. */
export function isKernelModelRequest(input: RequestInfo | URL, init?: RequestInit): boolean {
  const request = typeof input === 'object' && 'method' in input ? input : null;
  const method = (init?.method ?? request?.method ?? 'GET').toUpperCase();
  if (method !== 'GET') {
    return false;
  }
  const url = request !== null ? request.url : String(input);
  let path: string;
  try {
    path = new URL(url, 'http://localhost').pathname;
  } catch {
    return false;
  }
  return KERNEL_MODEL.test(path);
}

/** `base`, asking again on a network error while a kernel's model is what is asked. */
export function patientFetch(base: Fetch, patience: Patience = DEFAULT_PATIENCE): Fetch {
  return async (input, init) => {
    if (!isKernelModelRequest(input, init)) {
      return base(input, init);
    }
    const request = typeof input === 'object' && 'clone' in input ? input : null;
    const deadline = patience.now() + patience.limit;
    let unreachable = false;
    for (;;) {
      const aborted = () => init?.signal?.aborted === true || request?.signal?.aborted === true;
      const again = () => !aborted() && patience.now() + patience.interval <= deadline;
      let response: Response;
      try {
        response = await base(request !== null ? request.clone() : input, init);
      } catch (error) {
        if (!again()) {
          throw error;
        }
        unreachable = true;
        await patience.sleep(patience.interval);
        continue;
      }
      if (response.status !== 404 || !unreachable || !again()) {
        return response;
      }
      await patience.sleep(patience.interval);
    }
  };
}
