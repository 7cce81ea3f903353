/**
 * This page's own executions whose `execute_reply` never comes.
 *
 * JupyterLab shows a cell as running (`[*]`) until its execute_reply arrives on the shell
 * channel. When the gateway is restarted during an execution, the kernel sends that
 * reply to the shell socket of the gateway that carried the request, which is gone: the
 * reply is lost, while the IOPub messages (resumed by seq) still arrive, `status: idle`
 * included. The rule kept here: an execution this page sent whose `status: idle` came
 * without its reply is settled by the caller after a grace period (the reply travels on
 * another channel, and may just be late) — its execution count shown, the cell idle —
 * unless the reply came meanwhile or the cell was run again.
 *
 * Pure bookkeeping: the caller owns the timer and the cells.
 */

import type { IOPubMessage } from './restore';

/** An execution of this page that ended without a reply (yet). */
export interface Unreplied {
  readonly msgId: string;
  readonly cellId: string;
  /** From its `execute_input`, or `null` if none was seen. */
  readonly executionCount: number | null;
}

/** This page's executions awaiting their execute_reply, by msg_id. */
export class OwnExecutions {
  /** This page sent an execute_request for `cellId` (JupyterLab's `metadata.cellId`). */
  sent(msgId: string, cellId: unknown): void {
    if (typeof cellId !== 'string') {
      return;
    }
    this._pending.set(msgId, { cellId, executionCount: null, idle: false });
    this._latest.set(cellId, msgId);
  }

  /** Its execute_reply arrived: JupyterLab settles the cell itself. */
  replied(msgId: string): void {
    this._pending.delete(msgId);
  }

  /**
   * Take an IOPub message.
   *
   * @returns The execution to settle after the grace period, when this is the
   *   `status: idle` of one still awaiting its reply.
   */
  receive(message: IOPubMessage): Unreplied | null {
    const msgId = message.parent_header.msg_id;
    const entry = msgId === undefined ? undefined : this._pending.get(msgId);
    if (msgId === undefined || entry === undefined) {
      return null;
    }
    const type = message.header.msg_type;
    const count = message.content['execution_count'];
    if ((type === 'execute_input' || type === 'execute_result') && typeof count === 'number') {
      entry.executionCount = count;
    }
    if (type === 'status' && message.content['execution_state'] === 'idle' && !entry.idle) {
      entry.idle = true;
      return { msgId, cellId: entry.cellId, executionCount: entry.executionCount };
    }
    return null;
  }

  /**
   * Whether `execution` is still to be settled once its grace period is over: no reply
   * came, and its cell was not run again since. Forgets it either way.
   */
  settle(execution: Unreplied): boolean {
    const pending = this._pending.has(execution.msgId);
    this._pending.delete(execution.msgId);
    return pending && this._latest.get(execution.cellId) === execution.msgId;
  }

  /** The kernel restarted or died: no reply will come for what was pending. */
  clear(): void {
    this._pending.clear();
  }

  private readonly _pending = new Map<
    string,
    { cellId: string; executionCount: number | null; idle: boolean }
  >();
  /** cellId -> the msg_id of the latest execute_request this page sent for it. */
  private readonly _latest = new Map<string, string>();
}
