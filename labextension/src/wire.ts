/**
 * What the resume logic needs from one kernel WebSocket frame: its channel and the
 * gateway's mark, `metadata.kernel_gateway_stream = {seq, first_seq}`, which the gateway
 * puts on every IOPub message it sends (`first_seq < seq` when it merged stream messages
 * `first_seq..seq` into one).
 *
 * Pure: no DOM, no JupyterLab. Frames are read as JupyterLab's own serializer
 * (`@jupyterlab/services` kernel/serialize.ts) reads them:
 *
 * - `v1.kernel.websocket.jupyter.org`: a uint64 LE count `n`, `n` uint64 LE offsets, then
 *   channel, header, parent_header, metadata, content and buffers, each part running from
 *   its offset to the next one (the last to the end of the frame);
 * - the legacy protocol: a JSON text frame, or a binary frame of a uint32 BE count, that
 *   many uint32 BE offsets, the JSON message then its buffers.
 *
 * Only the metadata part of a v1 frame is decoded. Nothing is searched for in raw text:
 * a kernel's output could contain a forged key, so a mark is only ever read from the
 * parsed metadata object.
 */

/** The v1 kernel WebSocket subprotocol (Jupyter server's kernel WebSocket protocols). */
export const V1_PROTOCOL = 'v1.kernel.websocket.jupyter.org';

/** The gateway's sequence numbers of one IOPub message. */
export interface GatewayMark {
  /** The seq of the last message this one carries. */
  readonly seq: number;
  /** The seq of the first; below `seq` when stream messages were merged. */
  readonly firstSeq: number;
}

/** What a frame says about resuming. */
export interface FrameSummary {
  /** `iopub`, `shell`, ...; `null` when the frame could not be read. */
  readonly channel: string | null;
  /** The gateway's mark; `null` when the message has none (not IOPub, or no gateway). */
  readonly mark: GatewayMark | null;
  /** An IOPub message's header msg_id (the kernel's), when it has one. */
  readonly msgId?: string | null;
}

const UNREADABLE: FrameSummary = Object.freeze({ channel: null, mark: null });

/**
 * Summarize a frame received on a kernel channels WebSocket.
 *
 * @param data - The MessageEvent's data: a string, or an ArrayBuffer (JupyterLab sets
 *   `binaryType = 'arraybuffer'`). Anything else (a Blob) is unreadable here.
 * @param protocol - The WebSocket's negotiated subprotocol (`''` for the legacy one).
 * @returns The summary; an unreadable frame gives `{channel: null, mark: null}` and is
 *   left for JupyterLab to judge (it reports malformed messages itself).
 */
export function summarizeFrame(data: unknown, protocol: string): FrameSummary {
  try {
    if (typeof data === 'string') {
      return summarizeMessage(JSON.parse(data), undefined);
    }
    if (data instanceof ArrayBuffer) {
      return protocol === V1_PROTOCOL
        ? summarizeV1(data)
        : summarizeLegacyBinary(data);
    }
  } catch {
    return UNREADABLE;
  }
  return UNREADABLE;
}

/**
 * Read the gateway's mark from a message's metadata object.
 *
 * @returns The mark, or `null` unless `metadata.kernel_gateway_stream.seq` is a
 *   non-negative safe integer (`first_seq` defaults to `seq` when absent or invalid).
 */
export function readMark(metadata: unknown): GatewayMark | null {
  if (!isObject(metadata)) {
    return null;
  }
  const mark = metadata['kernel_gateway_stream'];
  if (!isObject(mark) || !isSeq(mark['seq'])) {
    return null;
  }
  const seq = mark['seq'];
  const first = mark['first_seq'];
  return { seq, firstSeq: isSeq(first) && first <= seq ? first : seq };
}

function summarizeMessage(message: unknown, channel: string | undefined): FrameSummary {
  if (!isObject(message)) {
    return UNREADABLE;
  }
  const named = channel ?? message['channel'];
  if (typeof named !== 'string') {
    return UNREADABLE;
  }
  if (named !== 'iopub') {
    return { channel: named, mark: null };
  }
  return { channel: named, mark: readMark(message['metadata']), msgId: readMsgId(message['header']) };
}

/** The msg_id of a parsed header object, or `null`. */
function readMsgId(header: unknown): string | null {
  if (!isObject(header)) {
    return null;
  }
  const msgId = header['msg_id'];
  return typeof msgId === 'string' && msgId !== '' ? msgId : null;
}

function summarizeV1(buffer: ArrayBuffer): FrameSummary {
  const view = new DataView(buffer);
  const count = Number(view.getBigUint64(0, true));
  // The channel and the four JSON parts need five offsets at least.
  if (count < 5 || 8 * (count + 1) > buffer.byteLength) {
    return UNREADABLE;
  }
  const offsets: number[] = [];
  for (let i = 0; i < count; i++) {
    offsets.push(Number(view.getBigUint64(8 * (i + 1), true)));
  }
  const part = (index: number): Uint8Array | null => {
    const start = offsets[index];
    const end = index + 1 < offsets.length ? offsets[index + 1] : buffer.byteLength;
    if (start < 8 * (count + 1) || end < start || end > buffer.byteLength) {
      return null;
    }
    return new Uint8Array(buffer, start, end - start);
  };
  const channelBytes = part(0);
  if (channelBytes === null) {
    return UNREADABLE;
  }
  const decoder = new TextDecoder('utf-8', { fatal: true });
  const channel = decoder.decode(channelBytes);
  if (channel !== 'iopub') {
    return { channel, mark: null };
  }
  const metadataBytes = part(3);
  const headerBytes = part(1);
  if (metadataBytes === null || headerBytes === null) {
    return UNREADABLE;
  }
  return {
    channel,
    mark: readMark(JSON.parse(decoder.decode(metadataBytes))),
    msgId: readMsgId(JSON.parse(decoder.decode(headerBytes)))
  };
}

function summarizeLegacyBinary(buffer: ArrayBuffer): FrameSummary {
  const view = new DataView(buffer);
  const count = view.getUint32(0, false);
  if (count < 1 || 4 * (count + 1) > buffer.byteLength) {
    return UNREADABLE;
  }
  const start = view.getUint32(4, false);
  const end = count > 1 ? view.getUint32(8, false) : buffer.byteLength;
  if (start < 4 * (count + 1) || end < start || end > buffer.byteLength) {
    return UNREADABLE;
  }
  const text = new TextDecoder('utf-8', { fatal: true }).decode(
    new Uint8Array(buffer, start, end - start)
  );
  return summarizeMessage(JSON.parse(text), undefined);
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function isSeq(value: unknown): value is number {
  return typeof value === 'number' && Number.isSafeInteger(value) && value >= 0;
}
