// assign: 1 workgroups of 256
fn chroma_f32_bits(b: u32) -> f32 { return bitcast<f32>(b); }
@group(0) @binding(1) var<storage, read_write> s0: array<u32>;
struct Params { p0: u32, p1: u32, }
@group(0) @binding(0) var<uniform> prm: Params;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lidx: u32, @builtin(workgroup_id) wgid: vec3<u32>) {
  let lid = i32(lidx);
  let wg = i32(wgid.x + wgid.y * 1u);
  let i0: i32 = ((wg * 256i) + lid);
  if ((i0 < 32i)) {
    let c1: i32 = (i0 % 8i);
    let c2: i32 = (i0 / 8i);
    let t3: f32 = bitcast<f32>(s0[((i32(prm.p0) + (c2 * 8i)) + c1)]);
    let t4: f32 = (t3 * 2.0f);
    let t5: f32 = (t4 + 1.0f);
    let t6: f32 = (1.0f / (1.0f + exp((-t5))));
    s0[((i32(prm.p1) + (c2 * 8i)) + c1)] = bitcast<u32>(t6);
  }
}
