/**
 * Frames as the gateway sends them (kernel_gateway_stream/core/wire.py), for the tests.
 */

const encoder = new TextEncoder();

export interface Message {
  channel: string;
  header: Record<string, unknown>;
  parent_header: Record<string, unknown>;
  metadata: Record<string, unknown>;
  content: Record<string, unknown>;
}

/** An IOPub message of `msgType` for execution `parent`, marked with `seq`. */
export function iopub(
  msgType: string,
  content: Record<string, unknown>,
  parent: string,
  seq: number | null,
  firstSeq: number = seq ?? 0
): Message {
  return {
    channel: 'iopub',
    header: { msg_id: `m${seq}`, msg_type: msgType, session: 'kernel', username: '', date: '', version: '5.3' },
    parent_header: { msg_id: parent },
    metadata: seq === null ? {} : { kernel_gateway_stream: { seq, first_seq: firstSeq } },
    content
  };
}

/** The v1 frame of `message`: count, offsets (with the end), channel, four JSON parts. */
export function v1Frame(message: Message, buffers: Uint8Array[] = []): ArrayBuffer {
  const parts = [
    encoder.encode(message.channel),
    encoder.encode(JSON.stringify(message.header)),
    encoder.encode(JSON.stringify(message.parent_header)),
    encoder.encode(JSON.stringify(message.metadata)),
    encoder.encode(JSON.stringify(message.content)),
    ...buffers
  ];
  const count = parts.length + 1;
  const offsets = [8 * (count + 1)];
  for (const part of parts) {
    offsets.push(offsets[offsets.length - 1] + part.length);
  }
  const frame = new Uint8Array(offsets[offsets.length - 1]);
  const view = new DataView(frame.buffer);
  view.setBigUint64(0, BigInt(count), true);
  offsets.forEach((offset, index) => view.setBigUint64(8 * (index + 1), BigInt(offset), true));
  parts.forEach((part, index) => frame.set(part, offsets[index]));
  return frame.buffer;
}

/** The legacy JSON text frame of `message`. */
export function jsonFrame(message: Message): string {
  return JSON.stringify({ ...message, buffers: [] });
}

/** The legacy binary frame: uint32 BE count and offsets, the JSON, then the buffers. */
export function legacyBinaryFrame(message: Message, buffers: Uint8Array[]): ArrayBuffer {
  const chunks = [encoder.encode(JSON.stringify(message)), ...buffers];
  const offsets = [4 * (chunks.length + 1)];
  for (const chunk of chunks.slice(0, -1)) {
    offsets.push(offsets[offsets.length - 1] + chunk.length);
  }
  const total = offsets[offsets.length - 1] + chunks[chunks.length - 1].length;
  const frame = new Uint8Array(total);
  const view = new DataView(frame.buffer);
  view.setUint32(0, chunks.length, false);
  offsets.forEach((offset, index) => view.setUint32(4 * (index + 1), offset, false));
  chunks.forEach((chunk, index) => frame.set(chunk, offsets[index]));
  return frame.buffer;
}
