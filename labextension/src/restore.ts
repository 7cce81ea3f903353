/**
 * Bringing a notebook's cells up to date from the gateway, as pure logic over a minimal
 * output-model interface (JupyterLab's `IOutputAreaModel` and `ICodeCellModel` fit it).
 *
 * The gateway answers `GET /api/kernels/<id>/cells` with the latest execution of each
 * cell in the kernel's current life (see {@link parseCellsAnswer}). The rules:
 *
 * 1. Only executions whose cell is in this notebook, and that this page did not send
 *    (those reach the cell through JupyterLab's own future), are restored.
 * 2. A finished execution that the cell already shows (same execution count, some
 *    output) is left alone; otherwise the cell gets its outputs and execution count.
 *    A cell given an execution's outputs is trusted, as JupyterLab trusts a cell it
 *    runs (`CodeCell.execute`): the outputs came from this notebook's kernel running
 *    that cell, not from the notebook's file, so they render as they did live (widget
 *    views, HTML) even in a notebook JupyterLab has not signed.
 * 3. A queued or running one gets its outputs so far, shows as running, and is followed:
 *    its IOPub messages above the answer's `head` are applied as JupyterLab's output
 *    area applies them (`@jupyterlab/outputarea` widget.ts `_onIOPub`) until its
 *    `status: idle`.
 * 4. The answer and the live messages must join without a gap. The gateway's seqs are
 *    gap-free per kernel and the page's socket receives every message from the first
 *    one it gets, `first`: an answer joins when `first <= head + 1`. One that does not
 *    (the request was answered before the socket's subscription began) is asked again:
 *    any answer given after `first` arrived has `head >= first`. Until an answer joins,
 *    the messages wait in a buffer (see {@link LiveRestore}).
 */

/** An nbformat v4 output, as the gateway sends it and JupyterLab's model takes it. */
export interface OutputJSON {
  readonly output_type: string;
  readonly [key: string]: unknown;
}

/** The status of an execution, as the gateway reports it. */
export type ExecutionStatus =
  | 'queued'
  | 'running'
  | 'ok'
  | 'error'
  | 'interrupted'
  | 'aborted'
  | 'died';

const STATUSES: ReadonlySet<string> = new Set([
  'queued',
  'running',
  'ok',
  'error',
  'interrupted',
  'aborted',
  'died'
]);

/** One cell's latest execution in the gateway's answer. */
export interface RestoredExecution {
  readonly cellId: string;
  readonly msgId: string;
  readonly status: ExecutionStatus;
  readonly executionCount: number | null;
  readonly outputs: readonly OutputJSON[];
  /** display_id -> indices into `outputs`. */
  readonly displayIds: ReadonlyMap<string, readonly number[]>;
  readonly firstSeq: number;
  readonly lastSeq: number;
  /** The gateway kept only part of the outputs (its answer is bounded in size). */
  readonly truncated: boolean;
}

/** The gateway's answer to `GET /api/kernels/<id>/cells`. */
export interface CellsAnswer {
  readonly kernelId: string;
  /** The last seq the answer covers; messages above it are live. */
  readonly head: number;
  readonly epoch: number;
  readonly executions: readonly RestoredExecution[];
  readonly truncated: boolean;
}

/** The answer did not have the documented shape. */
export class MalformedAnswer extends Error {
  constructor(message: string) {
    super(`malformed /cells answer: ${message}`);
    this.name = 'MalformedAnswer';
  }
}

/**
 * Check and convert the JSON body of a `/cells` answer.
 *
 * @throws {MalformedAnswer} when a documented field is missing or of the wrong type.
 */
export function parseCellsAnswer(body: unknown): CellsAnswer {
  const root = object(body, 'the answer');
  const executions = array(root['executions'], 'executions').map((item, index) =>
    parseExecution(item, `executions[${index}]`)
  );
  return Object.freeze({
    kernelId: string(root['kernel_id'], 'kernel_id'),
    head: integer(root['head'], 'head'),
    epoch: integer(root['epoch'] ?? 0, 'epoch'),
    executions: Object.freeze(executions),
    truncated: root['truncated'] === true
  });
}

function parseExecution(value: unknown, where: string): RestoredExecution {
  const item = object(value, where);
  const status = string(item['status'], `${where}.status`);
  if (!STATUSES.has(status)) {
    throw new MalformedAnswer(`${where}.status is ${JSON.stringify(status)}`);
  }
  const count = item['execution_count'];
  const outputs = array(item['outputs'] ?? [], `${where}.outputs`).map((output, index) => {
    const parsed = object(output, `${where}.outputs[${index}]`);
    string(parsed['output_type'], `${where}.outputs[${index}].output_type`);
    return parsed as unknown as OutputJSON;
  });
  const displayIds = new Map<string, readonly number[]>();
  const ids = object(item['display_ids'] ?? {}, `${where}.display_ids`);
  for (const [displayId, indices] of Object.entries(ids)) {
    displayIds.set(
      displayId,
      array(indices, `${where}.display_ids`).map(index =>
        integer(index, `${where}.display_ids`)
      )
    );
  }
  return Object.freeze({
    cellId: string(item['cell_id'], `${where}.cell_id`),
    msgId: string(item['msg_id'], `${where}.msg_id`),
    status: status as ExecutionStatus,
    executionCount: count === null || count === undefined ? null : integer(count, where),
    outputs: Object.freeze(outputs),
    displayIds,
    firstSeq: integer(item['first_seq'] ?? 0, `${where}.first_seq`),
    lastSeq: integer(item['last_seq'] ?? 0, `${where}.last_seq`),
    truncated: item['truncated'] === true
  });
}

/** What the restore needs of a cell's outputs: `IOutputAreaModel` fits. */
export interface OutputList {
  readonly length: number;
  /** Add an output; consecutive streams merge and `\r`/`\b` apply, as JupyterLab does. */
  add(output: OutputJSON): number;
  set(index: number, output: OutputJSON): void;
  /** Clear now, or (`wait`) just before the next output is added. */
  clear(wait?: boolean): void;
  /** The outputs as nbformat JSON (`IOutputAreaModel.toJSON`). */
  toJSON?(): readonly OutputJSON[];
}

/** What the restore needs of a code cell: `ICodeCellModel` fits. */
export interface RestorableCell {
  readonly outputs: OutputList;
  executionCount: number | null;
  /** JupyterLab >= 4.1 shows `[*]` while this is `running`. */
  executionState?: 'idle' | 'running';
  /** Whether outputs render with every renderer (`ICellModel.trusted`). */
  trusted?: boolean;
}

/** An IOPub message as JupyterLab's kernel connection emits it. */
export interface IOPubMessage {
  readonly header: { readonly msg_type: string };
  readonly parent_header: { readonly msg_id?: string } | Record<string, never>;
  readonly metadata: Readonly<Record<string, unknown>>;
  readonly content: Readonly<Record<string, unknown>>;
}

/** What {@link restoreCells} did. */
export interface RestoreResult {
  /** Cells whose outputs were replaced or that are now followed live. */
  readonly restored: number;
  /** Of those, cells whose outputs the gateway truncated. */
  readonly truncated: number;
  /** One per queued or running execution, to be fed the kernel's IOPub messages. */
  readonly followers: readonly ExecutionFollower[];
}

/**
 * Apply a `/cells` answer to a notebook's cells (rules 1-3 above).
 *
 * @param cellFor - The notebook's code cell with this id, if any.
 * @param sentByThisPage - Whether this page sent the execute_request with this msg_id.
 */
export function restoreCells(
  answer: CellsAnswer,
  cellFor: (cellId: string) => RestorableCell | undefined,
  sentByThisPage: (msgId: string) => boolean
): RestoreResult {
  let restored = 0;
  let truncated = 0;
  const followers: ExecutionFollower[] = [];
  for (const execution of answer.executions) {
    const cell = cellFor(execution.cellId);
    if (cell === undefined || sentByThisPage(execution.msgId)) {
      continue;
    }
    const live = execution.status === 'queued' || execution.status === 'running';
    if (!live && showsAlready(cell, execution)) {
      continue;
    }
    if ('trusted' in cell) {
      cell.trusted = true; // before the outputs: each is made trusted as it is added
    }
    replaceOutputs(cell.outputs, execution.outputs);
    if (live) {
      followers.push(new ExecutionFollower(cell, execution, answer.head));
    } else {
      cell.executionCount = execution.executionCount;
      if ('executionState' in cell) {
        cell.executionState = 'idle';
      }
    }
    restored += 1;
    truncated += execution.truncated ? 1 : 0;
  }
  return { restored, truncated, followers };
}

/**
 * True if the cell already shows this finished execution: its count and, where the
 * outputs can be read, the same outputs. A count alone is not enough: after a restart a
 * new life counts from 1 again, and a notebook saved in the old life shows old outputs
 * under the same numbers.
 */
function showsAlready(cell: RestorableCell, execution: RestoredExecution): boolean {
  if (cell.executionCount !== execution.executionCount || cell.outputs.length === 0) {
    return false;
  }
  const shown = cell.outputs.toJSON?.();
  return shown === undefined || sameJSON(shown, execution.outputs);
}

/** Equal as JSON, whatever the order of object keys. */
export function sameJSON(a: unknown, b: unknown): boolean {
  return canonical(a) === canonical(b);
}

function canonical(value: unknown): string {
  if (Array.isArray(value)) {
    return `[${value.map(canonical).join(',')}]`;
  }
  if (value !== null && typeof value === 'object') {
    const entries = Object.keys(value as Record<string, unknown>)
      .sort()
      .map(key => `${JSON.stringify(key)}:${canonical((value as Record<string, unknown>)[key])}`);
    return `{${entries.join(',')}}`;
  }
  return JSON.stringify(value) ?? 'null';
}

function replaceOutputs(list: OutputList, outputs: readonly OutputJSON[]): void {
  list.clear();
  for (const output of outputs) {
    list.add(output);
  }
}

/**
 * A queued or running execution kept live in its cell. Its owner feeds it every IOPub
 * message of the kernel (those received before the answer first, in order); it applies
 * those of its execution above the answer's head, once each.
 */
export class ExecutionFollower {
  constructor(cell: RestorableCell, execution: RestoredExecution, head: number) {
    this.cell = cell;
    this.msgId = execution.msgId;
    this.cellId = execution.cellId;
    this._applied = head;
    this._count = execution.executionCount;
    for (const [displayId, indices] of execution.displayIds) {
      this._displays.set(displayId, [...indices]);
    }
    if ('executionState' in cell) {
      cell.executionState = 'running';
    }
  }

  readonly cell: RestorableCell;
  readonly msgId: string;
  readonly cellId: string;

  /** Whether the execution ended (its `status: idle`) or was given up. */
  get done(): boolean {
    return this._done;
  }

  /**
   * Apply one IOPub message, if it belongs to this execution, carries a gateway seq
   * above every one applied so far (and above the answer's head), and this follower is
   * not done.
   *
   * @returns Whether the message was applied.
   */
  feed(message: IOPubMessage): boolean {
    if (this._done || message.parent_header.msg_id !== this.msgId) {
      return false;
    }
    const seq = markedSeq(message.metadata);
    if (seq === null || seq <= this._applied) {
      return false;
    }
    this._applied = seq;
    this._apply(message);
    return true;
  }

  /**
   * End following: the cell shows its execution count and stops showing as running.
   * Called on `status: idle`, and by the owner when the kernel restarts or dies, or when
   * this page runs the cell again.
   */
  finish(): void {
    if (this._done) {
      return;
    }
    this._done = true;
    if (this._count !== null) {
      this.cell.executionCount = this._count;
    }
    if ('executionState' in this.cell) {
      this.cell.executionState = 'idle';
    }
  }

  /** Stop following without touching the cell (this page now runs it itself). */
  abandon(): void {
    this._done = true;
  }

  private _apply(message: IOPubMessage): void {
    const outputs = this.cell.outputs;
    const type = message.header.msg_type;
    const content = message.content;
    switch (type) {
      case 'stream':
      case 'display_data':
      case 'execute_result':
      case 'error': {
        if (this._clearPending) {
          // The model clears just before this add (clear_output with wait).
          this._displays.clear();
          this._clearPending = false;
        }
        outputs.add({ ...content, output_type: type });
        const displayId = displayIdOf(content);
        if (type === 'display_data' && displayId !== null) {
          const targets = this._displays.get(displayId) ?? [];
          targets.push(outputs.length - 1);
          this._displays.set(displayId, targets);
        }
        if (type === 'execute_result' && typeof content['execution_count'] === 'number') {
          this._count = content['execution_count'];
        }
        break;
      }
      case 'clear_output': {
        const wait = content['wait'] === true;
        outputs.clear(wait);
        if (wait) {
          this._clearPending = true;
        } else {
          this._displays.clear();
          this._clearPending = false;
        }
        break;
      }
      case 'update_display_data': {
        const displayId = displayIdOf(content);
        const targets = displayId === null ? undefined : this._displays.get(displayId);
        for (const index of targets ?? []) {
          outputs.set(index, { ...content, output_type: 'display_data' });
        }
        break;
      }
      case 'execute_input':
        if (typeof content['execution_count'] === 'number') {
          this._count = content['execution_count'];
        }
        break;
      case 'status':
        if (content['execution_state'] === 'idle') {
          this.finish();
        }
        break;
      default:
        break;
    }
  }

  private _applied: number;
  private _count: number | null;
  private _done = false;
  private _clearPending = false;
  private readonly _displays = new Map<string, number[]>();
}

/** What {@link LiveRestore.apply} and {@link LiveRestore.receive} ask of their caller. */
export type NextStep = 'done' | 'refetch';

/**
 * One kernel connection's restore (rules 3 and 4): it receives every IOPub message of the
 * connection, in order, from the moment the connection is made, and each `/cells` answer.
 * The caller asks for another answer when told `'refetch'`.
 */
export class LiveRestore {
  /**
   * @param cellFor - The notebook's code cell with this id, if any.
   */
  constructor(cellFor: (cellId: string) => RestorableCell | undefined) {
    this._cellFor = cellFor;
  }

  /** Whether messages still wait for an answer that joins them. */
  get buffering(): boolean {
    return this._buffer !== null;
  }

  /** The executions followed live, by msg_id. */
  get followers(): ReadonlyMap<string, ExecutionFollower> {
    return this._followers;
  }

  /**
   * Apply an answer (rules 1-3), and tell whether it joins the live messages (rule 4).
   * Followers of an earlier answer are dropped: this one supersedes it.
   */
  apply(answer: CellsAnswer): { result: RestoreResult; next: NextStep } {
    this._followers.clear();
    const result = restoreCells(answer, this._cellFor, msgId => this._sent.has(msgId));
    for (const follower of result.followers) {
      this._followers.set(follower.msgId, follower);
    }
    this._head = answer.head;
    if (this._followers.size === 0 || (this._first !== null && this._first <= answer.head + 1)) {
      this._goLive();
      return { result, next: 'done' };
    }
    return { result, next: this._first === null ? 'done' : 'refetch' };
  }

  /**
   * Take one IOPub message of the connection.
   *
   * @returns `'refetch'` when it is the first message after an answer that it does not
   *   join (rule 4); `'done'` otherwise.
   */
  receive(message: IOPubMessage): NextStep {
    const seq = markedSeq(message.metadata);
    const isFirst = this._first === null && seq !== null;
    if (isFirst) {
      this._first = seq;
    }
    if (this._buffer === null) {
      this._feed(message);
      return 'done';
    }
    this._buffer.push(message);
    if (!isFirst || seq === null || this._head === null) {
      return 'done';
    }
    if (seq <= this._head + 1) {
      this._goLive();
      return 'done';
    }
    return 'refetch';
  }

  /**
   * This page sent an execute_request (JupyterLab's own future shows its output): its
   * execution is never restored, and a cell it runs again is no longer followed.
   */
  sent(msgId: string, cellId: unknown): void {
    this._sent.add(msgId);
    for (const follower of [...this._followers.values()]) {
      if (follower.cellId === cellId) {
        follower.abandon();
        this._followers.delete(follower.msgId);
      }
    }
  }

  /** The kernel restarted or died: every execution followed ends. */
  end(): void {
    for (const follower of this._followers.values()) {
      follower.finish();
    }
    this._followers.clear();
  }

  /** Stop: messages are no longer buffered, nor followers fed. */
  dispose(): void {
    this.end();
    this._buffer = null;
  }

  private _goLive(): void {
    const buffered = this._buffer ?? [];
    this._buffer = null;
    for (const message of buffered) {
      this._feed(message);
    }
  }

  private _feed(message: IOPubMessage): void {
    const msgId = message.parent_header.msg_id;
    const follower = msgId === undefined ? undefined : this._followers.get(msgId);
    if (follower === undefined) {
      return;
    }
    follower.feed(message);
    if (follower.done) {
      this._followers.delete(follower.msgId);
    }
  }

  private readonly _cellFor: (cellId: string) => RestorableCell | undefined;
  private _buffer: IOPubMessage[] | null = [];
  private _head: number | null = null;
  private _first: number | null = null;
  private readonly _followers = new Map<string, ExecutionFollower>();
  private readonly _sent = new Set<string>();
}

/** The gateway's seq in an IOPub message's metadata, or `null`. */
export function markedSeq(metadata: Readonly<Record<string, unknown>>): number | null {
  const mark = metadata['kernel_gateway_stream'];
  if (typeof mark !== 'object' || mark === null) {
    return null;
  }
  const seq = (mark as Record<string, unknown>)['seq'];
  return typeof seq === 'number' && Number.isSafeInteger(seq) ? seq : null;
}

function displayIdOf(content: Readonly<Record<string, unknown>>): string | null {
  const transient = content['transient'];
  if (typeof transient !== 'object' || transient === null) {
    return null;
  }
  const displayId = (transient as Record<string, unknown>)['display_id'];
  return typeof displayId === 'string' ? displayId : null;
}

function object(value: unknown, where: string): Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new MalformedAnswer(`${where} is not an object`);
  }
  return value as Record<string, unknown>;
}

function array(value: unknown, where: string): unknown[] {
  if (!Array.isArray(value)) {
    throw new MalformedAnswer(`${where} is not an array`);
  }
  return value;
}

function string(value: unknown, where: string): string {
  if (typeof value !== 'string') {
    throw new MalformedAnswer(`${where} is not a string`);
  }
  return value;
}

function integer(value: unknown, where: string): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value)) {
    throw new MalformedAnswer(`${where} is not an integer`);
  }
  return value;
}
