// assign: 1 workgroups of 256
fn chroma_f32_bits(b: u32) -> f32 { return bitcast<f32>(b); }
@group(0) @binding(1) var<storage, read_write> s0: array<u32>;
struct Params { p0: u32, p1: u32, p2: u32, }
@group(0) @binding(0) var<uniform> prm: Params;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lidx: u32, @builtin(workgroup_id) wgid: vec3<u32>) {
  let lid = i32(lidx);
  let wg = i32(wgid.x + wgid.y * 1u);
  let i0: i32 = ((wg * 256i) + lid);
  if ((i0 < 12i)) {
    var word1: u32 = 0u;
    var keep2: u32 = 0u;
    for (var j3: i32 = 0i; j3 < 4i; j3 += 1i) {
      let e4: i32 = ((i0 * 4i) + j3);
      let t5: i32 = (j3 * 8i);
      if (((e4 >= 0i) && (e4 < 45i))) {
        let c6: i32 = (e4 % 9i);
        let c7: i32 = (e4 / 9i);
        let t8: f32 = bitcast<f32>(s0[((i32(prm.p1) + (c7 * 9i)) + c6)]);
        let t9: bool = (t8 > 0.0f);
        let t10: i32 = ((i32(prm.p2) + (c7 * 9i)) + c6);
        let t11: i32 = (t10 >> u32(2i));
        let t12: i32 = ((t10 & 3i) << u32(3i));
        let t13: bool = (((s0[t11] >> u32(t12)) & 255u) != 0u);
        let t14: bool = (t9 != t13);
        let t15: u32 = (u32(t14) & 255u);
        word1 = (word1 | (t15 << u32(t5)));
      } else {
        keep2 = (keep2 | (255u << u32(t5)));
      }
    }
    let w16: i32 = ((i32(prm.p0) >> u32(2i)) + i0);
    if ((keep2 == 0u)) {
      s0[w16] = word1;
    } else {
      s0[w16] = ((s0[w16] & keep2) | word1);
    }
  }
}
