// Reads the explorer's packed columnar bodies (see tilescope/explorer/_binary.py):
// "TSB1", uint32 header length, JSON header, padding to 8, then 8-aligned typed arrays.
const CTORS = {
  f64: Float64Array, f32: Float32Array, i32: Int32Array, u32: Uint32Array,
  i16: Int16Array, u16: Uint16Array, u8: Uint8Array, i8: Int8Array,
};

export function unpack(buffer) {
  const bytes = new Uint8Array(buffer);
  const magic = String.fromCharCode(bytes[0], bytes[1], bytes[2], bytes[3]);
  if (magic !== "TSB1") throw new Error(`unexpected body (magic ${JSON.stringify(magic)}, expected "TSB1")`);
  const hlen = new DataView(buffer).getUint32(4, true);
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + hlen)));
  const base = 8 + hlen + ((8 - ((8 + hlen) % 8)) % 8);
  const arrays = {};
  for (const a of header.arrays) {
    const Ctor = CTORS[a.dtype];
    if (!Ctor) throw new Error(`unknown dtype ${a.dtype} for array ${a.name}`);
    arrays[a.name] = new Ctor(buffer, base + a.offset, a.length);
  }
  return { header, arrays };
}
