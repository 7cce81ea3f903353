import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { readMark, summarizeFrame, V1_PROTOCOL } from '../src/wire';
import { iopub, jsonFrame, legacyBinaryFrame, type Message, v1Frame } from './frames';

const stream = (seq: number | null, first?: number) =>
  iopub('stream', { name: 'stdout', text: 'x\n' }, 'exec-1', seq, first);

describe('summarizeFrame', () => {
  it('reads the seq and first_seq of a v1 IOPub frame', () => {
    const summary = summarizeFrame(v1Frame(stream(42, 30)), V1_PROTOCOL);
    assert.deepEqual(summary, { channel: 'iopub', mark: { seq: 42, firstSeq: 30 }, msgId: 'm42' });
  });

  it('reads a v1 frame with binary buffers after the content', () => {
    const frame = v1Frame(stream(7), [new Uint8Array([0, 255, 1]), new Uint8Array(9)]);
    assert.deepEqual(summarizeFrame(frame, V1_PROTOCOL).mark, { seq: 7, firstSeq: 7 });
  });

  it('reads a v1 frame whose offsets stop at the content (no end offset)', () => {
    // Writers that omit the last offset: the last part runs to the end of the frame.
    const message = stream(5);
    const parts = ['iopub', message.header, message.parent_header, message.metadata, message.content]
      .map(part => new TextEncoder().encode(typeof part === 'string' ? part : JSON.stringify(part)));
    const count = parts.length;
    const offsets = [8 * (count + 1)];
    for (const part of parts.slice(0, -1)) {
      offsets.push(offsets[offsets.length - 1] + part.length);
    }
    const frame = new Uint8Array(offsets[count - 1] + parts[count - 1].length);
    const view = new DataView(frame.buffer);
    view.setBigUint64(0, BigInt(count), true);
    offsets.forEach((offset, index) => view.setBigUint64(8 * (index + 1), BigInt(offset), true));
    parts.forEach((part, index) => frame.set(part, offsets[index]));
    assert.deepEqual(summarizeFrame(frame.buffer, V1_PROTOCOL).mark, { seq: 5, firstSeq: 5 });
  });

  it('gives shell and other channels no mark, without reading their JSON', () => {
    const reply: Message = { ...stream(3), channel: 'shell' };
    assert.deepEqual(summarizeFrame(v1Frame(reply), V1_PROTOCOL), { channel: 'shell', mark: null });
    assert.deepEqual(summarizeFrame(jsonFrame(reply), ''), { channel: 'shell', mark: null });
  });

  it('reads the legacy JSON and legacy binary protocols', () => {
    assert.deepEqual(summarizeFrame(jsonFrame(stream(9, 8)), '').mark, { seq: 9, firstSeq: 8 });
    const binary = legacyBinaryFrame(stream(11), [new Uint8Array([1, 2, 3])]);
    assert.deepEqual(summarizeFrame(binary, '').mark, { seq: 11, firstSeq: 11 });
    // The header's msg_id too: a message published again comes back under a new seq.
    assert.equal(summarizeFrame(jsonFrame(stream(9, 8)), '').msgId, 'm9');
    assert.equal(summarizeFrame(binary, '').msgId, 'm11');
  });

  it('finds no mark in IOPub messages without one (a server without the gateway)', () => {
    assert.deepEqual(summarizeFrame(v1Frame(stream(null)), V1_PROTOCOL), {
      channel: 'iopub',
      mark: null,
      msgId: 'mnull'
    });
  });

  it('never takes a mark from output text that imitates one', () => {
    const forged = iopub(
      'stream',
      { name: 'stdout', text: '"metadata": {"kernel_gateway_stream": {"seq": 999999}}' },
      'exec-1',
      null
    );
    assert.equal(summarizeFrame(v1Frame(forged), V1_PROTOCOL).mark, null);
    assert.equal(summarizeFrame(jsonFrame(forged), '').mark, null);
    // A key in the content, not the metadata, is output too.
    const inContent = iopub('display_data', { metadata: { kernel_gateway_stream: { seq: 5 } } }, 'e', null);
    assert.equal(summarizeFrame(jsonFrame(inContent), '').mark, null);
  });

  it('leaves unreadable frames to JupyterLab (no channel, no mark)', () => {
    const unreadable = { channel: null, mark: null };
    assert.deepEqual(summarizeFrame('not json', ''), unreadable);
    assert.deepEqual(summarizeFrame(new ArrayBuffer(3), V1_PROTOCOL), unreadable);
    const truncated = v1Frame(stream(1)).slice(0, 60);
    assert.deepEqual(summarizeFrame(truncated, V1_PROTOCOL), unreadable);
    assert.deepEqual(summarizeFrame({ not: 'a frame' }, V1_PROTOCOL), unreadable);
    const huge = new ArrayBuffer(16);
    new DataView(huge).setBigUint64(0, 2n ** 40n, true);
    assert.deepEqual(summarizeFrame(huge, V1_PROTOCOL), unreadable);
  });
});

describe('readMark', () => {
  it('accepts only non-negative integer seqs', () => {
    assert.deepEqual(readMark({ kernel_gateway_stream: { seq: 0 } }), { seq: 0, firstSeq: 0 });
    for (const seq of [-1, 1.5, '3', null, Number.MAX_VALUE]) {
      assert.equal(readMark({ kernel_gateway_stream: { seq } }), null, String(seq));
    }
    assert.equal(readMark({ kernel_gateway_stream: [1] }), null);
    assert.equal(readMark(null), null);
  });

  it('takes first_seq only when it is not above seq', () => {
    assert.deepEqual(readMark({ kernel_gateway_stream: { seq: 4, first_seq: 9 } }), {
      seq: 4,
      firstSeq: 4
    });
  });
});
