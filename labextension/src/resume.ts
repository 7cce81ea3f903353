/**
 * Exact resume of a kernel's channels WebSocket, as pure bookkeeping.
 *
 * JupyterLab's kernel connection (`@jupyterlab/services` kernel/default.ts) reconnects
 * after a dropped socket by opening a new one to the same
 * `.../api/kernels/<id>/channels?session_id=<client id>`. The gateway can resume a socket
 * exactly from a seq (`&since=<seq>`: every IOPub message after it, then live), and puts
 * the seq on every IOPub message. The rules kept here:
 *
 * 1. For each (kernel id, session id), remember the highest seq received.
 * 2. A socket opened again for a pair already seen asks for `since=<that seq>`.
 * 3. An IOPub message whose seq is at or below the highest seen for its pair was already
 *    delivered: it is dropped, so nothing is shown twice (a replay may overlap what a
 *    socket received just before it dropped).
 * 4. An IOPub message whose msg_id was already delivered for its pair is dropped too, under
 *    a new seq: a gateway killed after it had sent a message to this page, but before it
 *    had made it durable, numbers past it when it starts again, and a kernel of its
 *    launcher publishes that message again (it was never acknowledged as durable). The
 *    last {@link ResumeLedger.rememberedIds} msg_ids per pair are kept. (A message that
 *    reached the page merged into another stream message's frame is known by that frame's
 *    msg_id only.)
 * 5. After {@link ResumeLedger.maxFailuresWithSince} sockets in a row fail before they
 *    open, the next one goes without `since` (the gateway then resumes by session id):
 *    a `since` the gateway refuses (`400 since_ahead_of_head`, say) must not keep the
 *    notebook disconnected.
 *
 * Messages without a seq (shell, control and stdin replies; a server without the
 * gateway) are always delivered.
 */

import type { FrameSummary } from './wire';

/** The kernel channels socket a URL names. */
export interface ChannelsTarget {
  readonly kernelId: string;
  readonly sessionId: string;
}

/**
 * Parse a kernel channels URL (`ws(s)://host/<base>/api/kernels/<id>/channels?session_id=S`).
 *
 * @returns The target, or `null` for any other URL (terminals, events, ...) and for a
 *   channels URL without a session id (nothing to resume by).
 */
export function parseChannelsUrl(url: string): ChannelsTarget | null {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return null;
  }
  const match = /\/api\/kernels\/([^/]+)\/channels\/?$/.exec(parsed.pathname);
  const sessionId = parsed.searchParams.get('session_id');
  if (match === null || !sessionId) {
    return null;
  }
  return { kernelId: decodeURIComponent(match[1]), sessionId };
}

/**
 * `url` with `since=<seq>` added, unless it already has a `since`.
 */
export function withSince(url: string, seq: number): string {
  const parsed = new URL(url);
  if (parsed.searchParams.has('since')) {
    return url;
  }
  parsed.searchParams.set('since', String(seq));
  return parsed.toString();
}

/** Highest seqs received and failed attempts, per (kernel id, session id). */
export class ResumeLedger {
  /** Sockets in a row that may fail before opening while asking for `since`. */
  static readonly maxFailuresWithSince = 3;

  /** IOPub msg_ids remembered per pair, the newest (rule 4). */
  static readonly rememberedIds = 4096;

  /**
   * The URL a new socket should open: `url` itself the first time a pair is seen,
   * with `since` when this pair has received a seq before.
   */
  urlFor(url: string): string {
    const target = parseChannelsUrl(url);
    if (target === null) {
      return url;
    }
    const entry = this._entries.get(keyOf(target));
    if (
      entry === undefined ||
      entry.lastSeq === null ||
      entry.failures >= ResumeLedger.maxFailuresWithSince
    ) {
      return url;
    }
    return withSince(url, entry.lastSeq);
  }

  /**
   * Decide whether a received frame reaches JupyterLab, and record its seq if so.
   *
   * @returns `false` only for an IOPub message whose seq (rule 3) or msg_id (rule 4) was
   *   already received for the pair.
   */
  admit(target: ChannelsTarget, frame: FrameSummary): boolean {
    if (frame.channel !== 'iopub' || frame.mark === null) {
      return true;
    }
    const entry = this._entry(target);
    if (entry.lastSeq !== null && frame.mark.seq <= entry.lastSeq) {
      return false;
    }
    entry.lastSeq = frame.mark.seq;
    const msgId = frame.msgId;
    if (msgId) {
      if (entry.ids.has(msgId)) {
        return false;
      }
      entry.ids.add(msgId);
      if (entry.ids.size > ResumeLedger.rememberedIds) {
        // A Set iterates in insertion order: the first is the oldest.
        entry.ids.delete(entry.ids.values().next().value as string);
      }
    }
    return true;
  }

  /** A socket for `target` opened: the failure count starts again. */
  opened(target: ChannelsTarget): void {
    this._entry(target).failures = 0;
  }

  /** A socket for `target` closed or failed before it opened. */
  failedBeforeOpen(target: ChannelsTarget): void {
    this._entry(target).failures += 1;
  }

  /** The highest seq received for `target`, or `null`. */
  lastSeq(target: ChannelsTarget): number | null {
    return this._entries.get(keyOf(target))?.lastSeq ?? null;
  }

  private _entry(target: ChannelsTarget): LedgerEntry {
    const key = keyOf(target);
    let entry = this._entries.get(key);
    if (entry === undefined) {
      entry = { lastSeq: null, failures: 0, ids: new Set<string>() };
      this._entries.set(key, entry);
    }
    return entry;
  }

  private readonly _entries = new Map<string, LedgerEntry>();
}

interface LedgerEntry {
  lastSeq: number | null;
  failures: number;
  /** The last IOPub msg_ids admitted, oldest first. */
  ids: Set<string>;
}

function keyOf(target: ChannelsTarget): string {
  return JSON.stringify([target.kernelId, target.sessionId]);
}

/**
 * Whether a close event is the gateway stopping (code 1001, reason
 * `{"reason": "gateway_shutdown", ...}`). JupyterLab does not reconnect after a 1000 or
 * 1001 close; a gateway that stops is coming back (kernels outlive it), so the socket
 * reports such a close as 1012, "service restart" (RFC 6455 registry), and JupyterLab
 * reconnects. A kernel that shut down (reason `kernel_shutdown`) keeps its 1001.
 */
export function isGatewayRestart(code: number, reason: string): boolean {
  if (code !== 1001 || !reason) {
    return false;
  }
  try {
    const parsed: unknown = JSON.parse(reason);
    return (
      typeof parsed === 'object' &&
      parsed !== null &&
      (parsed as Record<string, unknown>)['reason'] === 'gateway_shutdown'
    );
  } catch {
    return false;
  }
}

/** The close code a gateway restart is reported with (RFC 6455: Service Restart). */
export const SERVICE_RESTART = 1012;
