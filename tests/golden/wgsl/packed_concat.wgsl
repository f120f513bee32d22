// concat: 1 workgroups of 256
fn chroma_f32_bits(b: u32) -> f32 { return bitcast<f32>(b); }
@group(0) @binding(1) var<storage, read_write> s0: array<atomic<u32>>;
struct Params { p0: u32, p1: u32, p2: u32, p3: u32, }
@group(0) @binding(0) var<uniform> prm: Params;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lidx: u32, @builtin(workgroup_id) wgid: vec3<u32>) {
  let lid = i32(lidx);
  let wg = i32(wgid.x + wgid.y * 1u);
  let i0: i32 = ((wg * 256i) + lid);
  if ((i0 < 60i)) {
    if ((i0 < 45i)) {
      let c1: i32 = (i0 % 9i);
      let c2: i32 = (i0 / 9i);
      let t3: f32 = bitcast<f32>(atomicLoad(&s0[((i32(prm.p0) + (c2 * 9i)) + c1)]));
      let t4: bool = (t3 > 0.0f);
      let t5: i32 = ((i32(prm.p1) + (c2 * 12i)) + c1);
      let t6: i32 = (t5 >> u32(2i));
      let t7: i32 = ((t5 & 3i) << u32(3i));
      let t8: u32 = (255u << u32(t7));
      let t9: u32 = ((u32(t4) & 255u) << u32(t7));
      atomicAnd(&s0[t6], ~t8); atomicOr(&s0[t6], t9);
    } else {
      let t10: i32 = (i0 - 45i);
      let c11: i32 = (t10 % 3i);
      let c12: i32 = (t10 / 3i);
      let t13: i32 = ((i32(prm.p2) + (c12 * 3i)) + c11);
      let t14: i32 = (t13 >> u32(2i));
      let t15: i32 = ((t13 & 3i) << u32(3i));
      let t16: bool = (((atomicLoad(&s0[t14]) >> u32(t15)) & 255u) != 0u);
      let t17: i32 = ((i32(prm.p3) + (c12 * 12i)) + c11);
      let t18: i32 = (t17 >> u32(2i));
      let t19: i32 = ((t17 & 3i) << u32(3i));
      let t20: u32 = (255u << u32(t19));
      let t21: u32 = ((u32(t16) & 255u) << u32(t19));
      atomicAnd(&s0[t18], ~t20); atomicOr(&s0[t18], t21);
    }
  }
}
