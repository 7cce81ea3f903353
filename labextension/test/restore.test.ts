import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  type CellsAnswer,
  type IOPubMessage,
  LiveRestore,
  MalformedAnswer,
  type OutputJSON,
  type OutputList,
  parseCellsAnswer,
  type RestorableCell,
  restoreCells
} from '../src/restore';
import { iopub } from './frames';

/** An output list that behaves like JupyterLab's OutputAreaModel where it matters here:
 *  `clear(true)` clears just before the next add. Streams are not merged: the calls are
 *  what is checked. */
class RecordingOutputs implements OutputList {
  items: OutputJSON[] = [];
  calls: string[] = [];
  private _clearNext = false;

  get length(): number {
    return this.items.length;
  }

  add(output: OutputJSON): number {
    if (this._clearNext) {
      this.items = [];
      this._clearNext = false;
    }
    this.calls.push(`add ${describeOutput(output)}`);
    this.items.push(output);
    return this.items.length;
  }

  set(index: number, output: OutputJSON): void {
    this.calls.push(`set ${index} ${describeOutput(output)}`);
    this.items[index] = output;
  }

  toJSON(): OutputJSON[] {
    return this.items;
  }

  clear(wait = false): void {
    this.calls.push(wait ? 'clear wait' : 'clear');
    if (wait) {
      this._clearNext = true;
    } else {
      this.items = [];
    }
  }
}

function describeOutput(output: OutputJSON): string {
  if (output.output_type === 'stream') {
    return `stream ${JSON.stringify(output['text'])}`;
  }
  const data = output['data'] as Record<string, unknown> | undefined;
  return `${output.output_type} ${JSON.stringify(data?.['text/plain'] ?? output['ename'])}`;
}

class Cell implements RestorableCell {
  constructor(
    public executionCount: number | null = null,
    outputs: OutputJSON[] = []
  ) {
    this.outputs.items = [...outputs];
  }
  readonly outputs = new RecordingOutputs();
  executionState: 'idle' | 'running' = 'idle';
  trusted = false;
}

const text = (value: string, name = 'stdout'): OutputJSON => ({
  output_type: 'stream',
  name,
  text: value
});

function answer(executions: unknown[], head = 100): CellsAnswer {
  return parseCellsAnswer({ kernel_id: 'k', head, epoch: 1, executions, truncated: false });
}

function execution(fields: Record<string, unknown>): Record<string, unknown> {
  return {
    cell_id: 'c1',
    msg_id: 'm1',
    status: 'ok',
    execution_count: 3,
    outputs: [text('done\n')],
    display_ids: {},
    first_seq: 10,
    last_seq: 20,
    truncated: false,
    ...fields
  };
}

const message = (
  msgType: string,
  content: Record<string, unknown>,
  seq: number,
  parent = 'm1'
): IOPubMessage => iopub(msgType, content, parent, seq) as unknown as IOPubMessage;

describe('parseCellsAnswer', () => {
  it('converts the documented answer', () => {
    const parsed = answer([
      execution({ display_ids: { d: [0, 2] }, execution_count: null, status: 'running' })
    ]);
    assert.equal(parsed.head, 100);
    assert.equal(parsed.executions[0].status, 'running');
    assert.equal(parsed.executions[0].executionCount, null);
    assert.deepEqual([...parsed.executions[0].displayIds], [['d', [0, 2]]]);
  });

  it('refuses answers of another shape', () => {
    const bad: unknown[] = [
      null,
      [],
      { kernel_id: 'k', head: '3', executions: [] },
      { kernel_id: 'k', head: 3, executions: {} },
      { kernel_id: 'k', head: 3, executions: [execution({ status: 'done' })] },
      { kernel_id: 'k', head: 3, executions: [execution({ outputs: [{ text: 'x' }] })] },
      { kernel_id: 'k', head: 3, executions: [execution({ cell_id: 5 })] },
      { kernel_id: 'k', head: 3, executions: [execution({ display_ids: { d: ['0'] } })] }
    ];
    for (const body of bad) {
      assert.throws(() => parseCellsAnswer(body), MalformedAnswer, JSON.stringify(body));
    }
  });
});

describe('restoreCells', () => {
  it('fills a finished execution the cell does not show, with its count', () => {
    const cell = new Cell(null, [text('stale\n')]);
    const result = restoreCells(answer([execution({})]), () => cell, () => false);
    assert.equal(result.restored, 1);
    assert.deepEqual(cell.outputs.calls, ['clear', 'add stream "done\\n"']);
    assert.equal(cell.executionCount, 3);
    assert.equal(result.followers.length, 0);
  });

  it('trusts a cell before giving it outputs, finished or still running', () => {
    // A notebook JupyterLab has not signed loads with untrusted cells; outputs added to one
    // would render as text only (a widget as `IntSlider(value=3)`).
    for (const status of ['ok', 'running'] as const) {
      const cell = new Cell();
      let trustedAtFirstAdd: boolean | null = null;
      const add = cell.outputs.add.bind(cell.outputs);
      cell.outputs.add = output => {
        trustedAtFirstAdd ??= cell.trusted;
        return add(output);
      };
      restoreCells(answer([execution({ status })]), () => cell, () => false);
      assert.equal(cell.trusted, true, status);
      assert.equal(trustedAtFirstAdd, true, status);
    }
  });

  it('leaves the trust of a cell it does not restore as it is', () => {
    const shown = new Cell(3, [text('done\n')]);
    const sent = new Cell();
    restoreCells(answer([execution({})]), () => shown, () => false);
    restoreCells(answer([execution({})]), () => sent, () => true);
    assert.equal(shown.trusted, false);
    assert.equal(sent.trusted, false);
  });

  it('leaves alone a cell that already shows the finished execution', () => {
    const cell = new Cell(3, [text('done\n')]);
    const result = restoreCells(answer([execution({})]), () => cell, () => false);
    assert.equal(result.restored, 0);
    assert.deepEqual(cell.outputs.calls, []);
  });

  it('replaces the same count showing other outputs (a life before a restart)', () => {
    const cell = new Cell(3, [text('from the old life\n')]);
    const result = restoreCells(answer([execution({})]), () => cell, () => false);
    assert.equal(result.restored, 1);
    assert.deepEqual(cell.outputs.items, [text('done\n')]);
  });

  it('restores a finished execution without output over a cell showing an older run', () => {
    const cell = new Cell(2, []);
    restoreCells(answer([execution({ outputs: [] })]), () => cell, () => false);
    assert.equal(cell.executionCount, 3);
  });

  it('skips cells not in the notebook and executions this page sent', () => {
    const cell = new Cell();
    const cells = new Map([['c1', cell]]);
    const result = restoreCells(
      answer([execution({ cell_id: 'elsewhere' }), execution({ msg_id: 'mine' })]),
      id => cells.get(id),
      msgId => msgId === 'mine'
    );
    assert.equal(result.restored, 0);
    assert.deepEqual(cell.outputs.calls, []);
  });

  it('counts truncated executions', () => {
    const result = restoreCells(
      answer([execution({ truncated: true }), execution({ cell_id: 'c2', msg_id: 'm2' })]),
      () => new Cell(),
      () => false
    );
    assert.deepEqual([result.restored, result.truncated], [2, 1]);
  });
});

describe('ExecutionFollower', () => {
  const running = (fields: Record<string, unknown> = {}) => {
    const cell = new Cell();
    const result = restoreCells(
      answer([execution({ status: 'running', outputs: [text('0\n1\n')], execution_count: 4, ...fields })]),
      () => cell,
      () => false
    );
    assert.equal(result.followers.length, 1);
    return { cell, follower: result.followers[0] };
  };

  it('shows a running execution as running, then applies only its messages above head', () => {
    const { cell, follower } = running();
    assert.equal(cell.executionState, 'running');
    assert.equal(cell.executionCount, null, 'the count shows when the execution ends');
    const applied = [
      message('stream', { name: 'stdout', text: 'old\n' }, 100), // covered by the answer
      message('stream', { name: 'stdout', text: '2\n' }, 101),
      message('stream', { name: 'stdout', text: '2\n' }, 101), // delivered twice
      message('stream', { name: 'stdout', text: 'other\n' }, 102, 'm-other'),
      message('stream', { name: 'stdout', text: 'unmarked\n' }, 0),
      message('stream', { name: 'stdout', text: '3\n' }, 103)
    ].map(msg => {
      if (msg.content['text'] === 'unmarked\n') {
        return follower.feed({ ...msg, metadata: {} });
      }
      return follower.feed(msg);
    });
    assert.deepEqual(applied, [false, true, false, false, false, true]);
    assert.deepEqual(cell.outputs.calls, [
      'clear',
      'add stream "0\\n1\\n"',
      'add stream "2\\n"',
      'add stream "3\\n"'
    ]);
    follower.feed(message('status', { execution_state: 'idle' }, 104));
    assert.ok(follower.done);
    assert.equal(cell.executionState, 'idle');
    assert.equal(cell.executionCount, 4);
    assert.equal(follower.feed(message('stream', { name: 'stdout', text: 'late\n' }, 105)), false);
  });

  it('takes the count from execute_input when the answer had none', () => {
    const { cell, follower } = running({ execution_count: null, status: 'queued' });
    follower.feed(message('execute_input', { code: 'x', execution_count: 9 }, 101));
    follower.feed(message('status', { execution_state: 'busy' }, 102));
    assert.equal(follower.done, false);
    follower.feed(message('status', { execution_state: 'idle' }, 103));
    assert.equal(cell.executionCount, 9);
  });

  it('honours clear_output, with wait, as the output model does', () => {
    const { cell, follower } = running();
    follower.feed(message('clear_output', { wait: true }, 101));
    assert.equal(cell.outputs.length, 1, 'wait: the old output stays until the next one');
    follower.feed(message('stream', { name: 'stdout', text: 'fresh\n' }, 102));
    assert.deepEqual(cell.outputs.items, [text('fresh\n')]);
    follower.feed(message('clear_output', { wait: false }, 103));
    assert.equal(cell.outputs.length, 0);
    assert.deepEqual(cell.outputs.calls.slice(-3), ['clear wait', 'add stream "fresh\\n"', 'clear']);
  });

  it('updates displays by display_id, from the answer and from new display_data', () => {
    const plot = (label: string, id: string) => ({
      data: { 'text/plain': label },
      metadata: {},
      transient: { display_id: id }
    });
    const { cell, follower } = running({
      outputs: [
        { output_type: 'display_data', ...plot('a0', 'a') },
        text('between\n'),
        { output_type: 'display_data', ...plot('a0 again', 'a') }
      ],
      display_ids: { a: [0, 2] }
    });
    follower.feed(message('display_data', plot('b0', 'b'), 101));
    follower.feed(message('update_display_data', plot('a1', 'a'), 102));
    follower.feed(message('update_display_data', plot('b1', 'b'), 103));
    follower.feed(message('update_display_data', plot('nobody', 'c'), 104));
    assert.deepEqual(cell.outputs.calls.slice(-4), [
      'add display_data "b0"',
      'set 0 display_data "a1"',
      'set 2 display_data "a1"',
      'set 3 display_data "b1"'
    ]);
    // After a clear the old indices mean nothing: updates to them are not applied.
    follower.feed(message('clear_output', { wait: false }, 105));
    follower.feed(message('update_display_data', plot('a2', 'a'), 106));
    assert.equal(cell.outputs.calls[cell.outputs.calls.length - 1], 'clear');
  });

  it('adds errors and results, and a result gives the count', () => {
    const { cell, follower } = running({ execution_count: null });
    follower.feed(message('execute_result', { data: { 'text/plain': '42' }, metadata: {}, execution_count: 5 }, 101));
    follower.feed(message('error', { ename: 'ZeroDivisionError', evalue: 'x', traceback: [] }, 102));
    follower.feed(message('status', { execution_state: 'idle' }, 103));
    assert.deepEqual(cell.outputs.calls.slice(-2), [
      'add execute_result "42"',
      'add error "ZeroDivisionError"'
    ]);
    assert.equal(cell.executionCount, 5);
  });

  it('finishes or abandons on its owner\'s word', () => {
    const { cell, follower } = running();
    follower.abandon();
    assert.ok(follower.done);
    assert.equal(cell.executionState, 'running', 'abandon leaves the cell to its new run');
    const other = running();
    other.follower.finish();
    assert.equal(other.cell.executionState, 'idle');
    assert.equal(other.cell.executionCount, 4);
  });
});

describe('LiveRestore', () => {
  const tick = (seq: number, parent = 'm1') =>
    message('stream', { name: 'stdout', text: `${seq}\n` }, seq, parent);
  const runningAnswer = (head: number, outputs: OutputJSON[] = [text('0\n')]) =>
    answer([execution({ status: 'running', outputs, execution_count: 4 })], head);

  it('joins an answer to the messages buffered meanwhile, without a gap or a repeat', () => {
    const cell = new Cell();
    const live = new LiveRestore(() => cell);
    // The socket's first messages arrive before the answer; the answer covers up to 101.
    for (const seq of [100, 101, 102]) {
      assert.equal(live.receive(tick(seq)), 'done');
    }
    assert.ok(live.buffering);
    const { result, next } = live.apply(runningAnswer(101));
    assert.equal(next, 'done');
    assert.equal(result.restored, 1);
    assert.equal(live.buffering, false);
    live.receive(tick(103));
    live.receive(tick(200, 'someone-else'));
    assert.deepEqual(cell.outputs.calls, ['clear', 'add stream "0\\n"', 'add stream "102\\n"', 'add stream "103\\n"']);
  });

  it('asks again when the answer ends before the socket began', () => {
    const cell = new Cell();
    const live = new LiveRestore(() => cell);
    live.receive(tick(105));
    assert.equal(live.apply(runningAnswer(101)).next, 'refetch', '102-104 would be lost');
    assert.ok(live.buffering);
    live.receive(tick(106));
    // Asked after 105 arrived, the next answer covers it.
    const again = live.apply(runningAnswer(105, [text('0\n'), text('1\n')]));
    assert.equal(again.next, 'done');
    assert.deepEqual(cell.outputs.calls.slice(-4), ['clear', 'add stream "0\\n"', 'add stream "1\\n"', 'add stream "106\\n"']);
  });

  it('waits for the first message to judge an answer given before any arrived', () => {
    const cell = new Cell();
    const live = new LiveRestore(() => cell);
    assert.equal(live.apply(runningAnswer(101)).next, 'done');
    assert.ok(live.buffering, 'no message yet: the join is not known');
    assert.equal(live.receive(tick(102)), 'done');
    assert.equal(live.buffering, false);
    assert.equal(cell.outputs.calls[cell.outputs.calls.length - 1], 'add stream "102\\n"');

    const late = new LiveRestore(() => new Cell());
    late.apply(runningAnswer(101));
    assert.equal(late.receive(tick(110)), 'refetch');
  });

  it('goes live at once when nothing runs', () => {
    const live = new LiveRestore(() => new Cell());
    const { result, next } = live.apply(answer([execution({})]));
    assert.deepEqual([result.restored, next, live.buffering], [1, 'done', false]);
  });

  it('restores nothing this page sent, and lets go of a cell this page runs again', () => {
    const cell = new Cell();
    const live = new LiveRestore(() => cell);
    live.sent('mine', 'c1');
    assert.equal(live.apply(answer([execution({ msg_id: 'mine', status: 'running' })])).result.restored, 0);
    live.apply(runningAnswer(101));
    live.receive(tick(102));
    assert.equal(live.followers.size, 1);
    live.sent('rerun', 'c1');
    assert.equal(live.followers.size, 0);
    live.receive(tick(103));
    assert.equal(cell.outputs.calls[cell.outputs.calls.length - 1], 'add stream "102\\n"');
  });

  it('ends every follower when the kernel restarts', () => {
    const cell = new Cell();
    const live = new LiveRestore(() => cell);
    live.apply(runningAnswer(101));
    assert.equal(cell.executionState, 'running');
    live.end();
    assert.equal(cell.executionState, 'idle');
    assert.equal(cell.executionCount, 4);
  });

  it('shows a finished execution as idle when a later answer replaces a running one', () => {
    const cell = new Cell();
    const live = new LiveRestore(() => cell);
    live.receive(tick(150));
    live.apply(runningAnswer(101));
    live.apply(answer([execution({ outputs: [text('all\n')] })], 160));
    assert.equal(cell.executionState, 'idle');
    assert.equal(cell.executionCount, 3);
  });
});
