/**
 * What the framework adapters (express.ts, fastify.ts) share before the protocol
 * runs: the request body read once, the path fingerprinted.
 */

/**
 * The bytes of a readable stream (a request body), or null once they pass `limit` (the
 * stream is then left paused). Rejects when the stream fails or closes before its end.
 * Events rather than `for await`: a request's body is read on every keyed request.
 */
export function readStream(stream: NodeJS.ReadableStream, limit: number): Promise<Buffer | null> {
  const readable = stream as NodeJS.ReadableStream & { readableEnded?: boolean };
  if (readable.readableEnded) return Promise.resolve(Buffer.alloc(0));
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const stop = () => {
      stream.off("data", onData);
      stream.off("end", onEnd);
      stream.off("error", onError);
      stream.off("close", onClose);
    };
    const onData = (chunk: Buffer | string) => {
      const bytes = typeof chunk === "string" ? Buffer.from(chunk, "utf8") : chunk;
      size += bytes.length;
      if (size > limit) {
        stop();
        stream.pause();
        resolve(null);
        return;
      }
      chunks.push(bytes);
    };
    const onEnd = () => {
      stop();
      resolve(chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, size));
    };
    const onError = (error: Error) => {
      stop();
      reject(error);
    };
    const onClose = () => onError(new Error("the request closed before its body ended"));
    stream.on("data", onData);
    stream.on("end", onEnd);
    stream.on("error", onError);
    stream.on("close", onClose);
  });
}
