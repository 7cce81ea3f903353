import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { OwnExecutions } from '../src/own';
import type { IOPubMessage } from '../src/restore';
import { iopub } from './frames';

const message = (msgType: string, content: Record<string, unknown>, parent: string, seq: number) =>
  iopub(msgType, content, parent, seq) as unknown as IOPubMessage;

describe('OwnExecutions', () => {
  it('hands over an execution whose idle came without its reply, with its count', () => {
    const own = new OwnExecutions();
    own.sent('m1', 'c1');
    assert.equal(own.receive(message('execute_input', { execution_count: 7 }, 'm1', 1)), null);
    assert.equal(own.receive(message('status', { execution_state: 'busy' }, 'm1', 2)), null);
    const ended = own.receive(message('status', { execution_state: 'idle' }, 'm1', 3));
    assert.deepEqual(ended, { msgId: 'm1', cellId: 'c1', executionCount: 7 });
    assert.equal(own.settle(ended!), true);
    assert.equal(own.settle(ended!), false, 'once');
  });

  it('leaves JupyterLab what its reply settles', () => {
    const own = new OwnExecutions();
    own.sent('m1', 'c1');
    own.replied('m1');
    assert.equal(own.receive(message('status', { execution_state: 'idle' }, 'm1', 3)), null);
    own.sent('m2', 'c1');
    const ended = own.receive(message('status', { execution_state: 'idle' }, 'm2', 4));
    own.replied('m2'); // late, within the grace period
    assert.equal(own.settle(ended!), false);
  });

  it('does not settle a cell that runs again', () => {
    const own = new OwnExecutions();
    own.sent('m1', 'c1');
    const ended = own.receive(message('status', { execution_state: 'idle' }, 'm1', 3));
    own.sent('m2', 'c1');
    assert.equal(own.settle(ended!), false);
  });

  it('ignores other pages\' executions and requests without a cell', () => {
    const own = new OwnExecutions();
    own.sent('console', undefined);
    assert.equal(own.receive(message('status', { execution_state: 'idle' }, 'console', 1)), null);
    assert.equal(own.receive(message('status', { execution_state: 'idle' }, 'other', 2)), null);
  });
});
