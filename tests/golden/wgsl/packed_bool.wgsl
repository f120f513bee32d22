// assign: 1 workgroups of 256
fn chroma_f32_bits(b: u32) -> f32 { return bitcast<f32>(b); }
@group(0) @binding(1) var<storage, read_write> s0: array<atomic<u32>>;
struct Params { p0: u32, p1: u32, p2: u32, }
@group(0) @binding(0) var<uniform> prm: Params;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lidx: u32, @builtin(workgroup_id) wgid: vec3<u32>) {
  let lid = i32(lidx);
  let wg = i32(wgid.x + wgid.y * 1u);
  let i0: i32 = ((wg * 256i) + lid);
  if ((i0 < 45i)) {
    let c1: i32 = (i0 % 9i);
    let c2: i32 = (i0 / 9i);
    let t3: f32 = bitcast<f32>(atomicLoad(&s0[((i32(prm.p0) + (c2 * 9i)) + c1)]));
    let t4: bool = (t3 > 0.0f);
    let t5: i32 = ((i32(prm.p1) + (c2 * 9i)) + c1);
    let t6: i32 = (t5 >> u32(2i));
    let t7: i32 = ((t5 & 3i) << u32(3i));
    let t8: bool = (((atomicLoad(&s0[t6]) >> u32(t7)) & 255u) != 0u);
    let t9: bool = (t4 != t8);
    let t10: i32 = ((i32(prm.p2) + (c2 * 9i)) + c1);
    let t11: i32 = (t10 >> u32(2i));
    let t12: i32 = ((t10 & 3i) << u32(3i));
    let t13: u32 = (255u << u32(t12));
    let t14: u32 = ((u32(t9) & 255u) << u32(t12));
    atomicAnd(&s0[t11], ~t13); atomicOr(&s0[t11], t14);
  }
}
