/**
 * One notebook's restore from the gateway: the JupyterLab side of ./restore.ts.
 *
 * Each time the notebook gets a kernel connection (the notebook opens, the page is
 * reloaded, the kernel is changed), a restorer
 *
 * 1. takes the connection's IOPub messages at once (a {@link LiveRestore} buffers them);
 * 2. once the connection's socket is open, asks `GET /api/kernels/<id>/cells`; not after
 *    the kernel_info reply, which a kernel busy with a cell sends only when it is done;
 * 3. applies the answer, asking again if it does not join the live messages.
 *
 * It also settles this page's own executions whose execute_reply was lost to a gateway
 * restart (./own.ts).
 *
 * A server without the gateway answers 404: nothing happens.
 */

import type { ISessionContext } from '@jupyterlab/apputils';
import type { ICodeCellModel } from '@jupyterlab/cells';
import { URLExt } from '@jupyterlab/coreutils';
import type { DocumentRegistry } from '@jupyterlab/docregistry';
import type { INotebookModel } from '@jupyterlab/notebook';
import { type Kernel, type KernelMessage, ServerConnection } from '@jupyterlab/services';

import { OwnExecutions, type Unreplied } from './own';
import {
  type CellsAnswer,
  type IOPubMessage,
  LiveRestore,
  parseCellsAnswer,
  type RestorableCell
} from './restore';

/** How a restorer tells the user what it did (`info`) or what is missing (`warning`). */
export type Notify = (message: string, kind: 'info' | 'warning') => void;

/** Why the gateway could not record output, as its gap records say. */
const GAP_REASONS: Readonly<Record<string, string>> = {
  gateway_restart: 'Kernel output printed while the gateway was stopped is missing',
  gateway_stopped:
    'The gateway stopped abruptly: output it had just received may be missing',
  store_backlog_full:
    "Some kernel output is missing: the gateway's store could not keep up"
};

/** Answers asked for one connection at most (the first, then ones that join it). */
const MAX_REQUESTS = 4;

/** How long an execution's reply may trail its `status: idle` (milliseconds). */
const REPLY_GRACE = 3000;

/** Keeps one notebook's cells up to date from the gateway. */
export class NotebookRestorer {
  /**
   * @param context - The notebook document; the restorer follows its session's kernel.
   * @param settings - Where the gateway is, and its token and XSRF handling.
   * @param notify - Called once per connection whose restore changed a cell.
   */
  constructor(
    context: DocumentRegistry.IContext<INotebookModel>,
    settings: ServerConnection.ISettings,
    notify: Notify
  ) {
    this._context = context;
    this._settings = settings;
    this._notify = notify;
    const session: ISessionContext = context.sessionContext;
    session.kernelChanged.connect(this._onKernelChanged, this);
    const kernel = session.session?.kernel;
    if (kernel) {
      this._watch(kernel);
    }
  }

  /** Stop following, and leave the cells as they are. */
  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._context.sessionContext.kernelChanged.disconnect(this._onKernelChanged, this);
    this._unwatch();
  }

  private _onKernelChanged(
    _: ISessionContext,
    change: { newValue: Kernel.IKernelConnection | null }
  ): void {
    this._unwatch();
    if (change.newValue) {
      this._watch(change.newValue);
    }
  }

  private _watch(kernel: Kernel.IKernelConnection): void {
    const cells = (cellId: string) => this._codeCell(cellId);
    const watch: Watch = {
      kernel,
      live: new LiveRestore(cells),
      own: new OwnExecutions(),
      gapsShown: new Set(),
      requests: 0,
      busy: false
    };
    this._watching = watch;
    kernel.iopubMessage.connect(this._onIOPub, this);
    kernel.anyMessage.connect(this._onAnyMessage, this);
    kernel.statusChanged.connect(this._onStatus, this);
    void this._request(watch, true);
  }

  private _unwatch(): void {
    const watch = this._watching;
    if (watch === null) {
      return;
    }
    this._watching = null;
    watch.kernel.iopubMessage.disconnect(this._onIOPub, this);
    watch.kernel.anyMessage.disconnect(this._onAnyMessage, this);
    watch.kernel.statusChanged.disconnect(this._onStatus, this);
    watch.live.dispose();
  }

  /** Ask for an answer and apply it; again while it does not join the live messages. */
  private async _request(watch: Watch, first: boolean): Promise<void> {
    if (watch.busy) {
      return;
    }
    watch.busy = true;
    try {
      if (first) {
        await Promise.all([this._context.ready, connected(watch.kernel)]);
      }
      while (this._watching === watch && watch.requests < MAX_REQUESTS) {
        watch.requests += 1;
        const answer = await this._fetch(watch.kernel.id);
        if (answer === null || this._watching !== watch) {
          watch.live.dispose(); // not a gateway (or the kernel is gone)
          return;
        }
        const { result, next } = watch.live.apply(answer);
        if (first && result.restored > 0) {
          const cellsText = result.restored === 1 ? '1 cell' : `${result.restored} cells`;
          const truncated =
            result.truncated > 0 ? ` (${result.truncated} truncated by the gateway)` : '';
          this._notify(`Restored output of ${cellsText} from the gateway${truncated}`, 'info');
        }
        first = false;
        if (next === 'done') {
          return;
        }
      }
      watch.live.dispose();
    } catch (error) {
      console.warn('kernel_gateway_stream: could not restore outputs', error);
      watch.live.dispose();
    } finally {
      watch.busy = false;
    }
  }

  /** The answer, or `null` from a server without the endpoint. */
  private async _fetch(kernelId: string): Promise<CellsAnswer | null> {
    const url = URLExt.join(
      this._settings.baseUrl,
      'api/kernels',
      encodeURIComponent(kernelId),
      'cells'
    );
    const response = await ServerConnection.makeRequest(url, {}, this._settings);
    if (response.status === 404) {
      return null;
    }
    if (!response.ok) {
      throw await ServerConnection.ResponseError.create(response);
    }
    return parseCellsAnswer(await response.json());
  }

  private _codeCell(cellId: string): RestorableCell | undefined {
    for (const cell of this._context.model.cells) {
      if (cell.id === cellId) {
        // ICodeCellModel's outputs take nbformat outputs: the gateway's are those.
        return cell.type === 'code'
          ? (cell as ICodeCellModel as unknown as RestorableCell)
          : undefined;
      }
    }
    return undefined;
  }

  private _onIOPub(_: Kernel.IKernelConnection, message: KernelMessage.IIOPubMessage): void {
    const watch = this._watching;
    if (watch === null) {
      return;
    }
    const plain = message as unknown as IOPubMessage;
    if (plain.header.msg_type === 'kernel_gateway_stream_gap') {
      this._onGap(watch, plain);
    }
    if (watch.live.receive(plain) === 'refetch') {
      void this._request(watch, false);
    }
    const unreplied = watch.own.receive(plain);
    if (unreplied !== null) {
      setTimeout(() => this._settle(watch, unreplied), REPLY_GRACE);
    }
  }

  /** The gateway says output is missing: tell the user, once per cause and connection. */
  private _onGap(watch: Watch, message: IOPubMessage): void {
    const reason = String(message.content['reason'] ?? '');
    const why =
      GAP_REASONS[reason] ??
      `Some kernel output may be missing (${reason || 'no reason given'})`;
    if (watch.gapsShown.has(why)) {
      return;
    }
    watch.gapsShown.add(why);
    this._notify(why, 'warning');
  }

  /** Show an execution of this page that ended without its reply as ended. */
  private _settle(watch: Watch, execution: Unreplied): void {
    if (this._watching !== watch || !watch.own.settle(execution)) {
      return;
    }
    const cell = this._codeCell(execution.cellId);
    if (cell === undefined || cell.executionState !== 'running') {
      return;
    }
    if (execution.executionCount !== null) {
      cell.executionCount = execution.executionCount;
    }
    cell.executionState = 'idle';
  }

  /** Executions this page sends are its own (JupyterLab's future shows them), until
   *  their reply comes. */
  private _onAnyMessage(_: Kernel.IKernelConnection, args: Kernel.IAnyMessageArgs): void {
    const watch = this._watching;
    if (watch === null) {
      return;
    }
    const message = args.msg;
    if (args.direction === 'send' && message.header.msg_type === 'execute_request') {
      const cellId = (message.metadata as Record<string, unknown>)['cellId'];
      watch.live.sent(message.header.msg_id, cellId);
      watch.own.sent(message.header.msg_id, cellId);
    } else if (args.direction === 'recv' && message.header.msg_type === 'execute_reply') {
      const parent = (message.parent_header as { msg_id?: string }).msg_id;
      if (parent !== undefined) {
        watch.own.replied(parent);
      }
    }
  }

  /** A kernel that restarts or dies ends every execution followed. */
  private _onStatus(_: Kernel.IKernelConnection, status: KernelMessage.Status): void {
    if (this._watching !== null && ENDING.has(status)) {
      this._watching.live.end();
      this._watching.own.clear();
    }
  }

  private readonly _context: DocumentRegistry.IContext<INotebookModel>;
  private readonly _settings: ServerConnection.ISettings;
  private readonly _notify: Notify;
  private _watching: Watch | null = null;
  private _disposed = false;
}

const ENDING: ReadonlySet<string> = new Set(['restarting', 'autorestarting', 'dead']);

/** What a restorer keeps about one kernel connection. */
interface Watch {
  readonly kernel: Kernel.IKernelConnection;
  readonly live: LiveRestore;
  readonly own: OwnExecutions;
  /** Causes of gaps the user was told about. */
  readonly gapsShown: Set<string>;
  /** Answers asked for so far. */
  requests: number;
  /** Whether a request is under way. */
  busy: boolean;
}

/** Resolves when the connection's socket is open (at once if it is). */
function connected(kernel: Kernel.IKernelConnection): Promise<void> {
  return new Promise(resolve => {
    if (kernel.connectionStatus === 'connected') {
      resolve();
      return;
    }
    const onChange = (_: Kernel.IKernelConnection, status: Kernel.ConnectionStatus) => {
      if (status === 'connected') {
        kernel.connectionStatusChanged.disconnect(onChange);
        resolve();
      }
    };
    kernel.connectionStatusChanged.connect(onChange);
  });
}
