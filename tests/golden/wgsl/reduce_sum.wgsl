// reduce: 4 workgroups of 128
fn chroma_f32_bits(b: u32) -> f32 { return bitcast<f32>(b); }
@group(0) @binding(1) var<storage, read_write> s0: array<u32>;
struct Params { p0: u32, p1: u32, }
@group(0) @binding(0) var<uniform> prm: Params;
var<workgroup> red: array<f32, 128>;
@compute @workgroup_size(128)
fn main(@builtin(local_invocation_index) lidx: u32, @builtin(workgroup_id) wgid: vec3<u32>) {
  let lid = i32(lidx);
  let wg = i32(wgid.x + wgid.y * 4u);
  var acc0: f32 = 0.0f;
  for (var r1: i32 = lid; r1 < 100i; r1 += 128i) {
    let t2: f32 = bitcast<f32>(s0[((i32(prm.p0) + (wg * 100i)) + r1)]);
    acc0 = (acc0 + t2);
  }
  red[lid] = acc0;
  workgroupBarrier();
  if ((lid < 64i)) {
    let t3: f32 = red[lid];
    let t4: f32 = red[(lid + 64i)];
    red[lid] = (t3 + t4);
  }
  workgroupBarrier();
  if ((lid < 32i)) {
    let t5: f32 = red[lid];
    let t6: f32 = red[(lid + 32i)];
    red[lid] = (t5 + t6);
  }
  workgroupBarrier();
  if ((lid < 16i)) {
    let t7: f32 = red[lid];
    let t8: f32 = red[(lid + 16i)];
    red[lid] = (t7 + t8);
  }
  workgroupBarrier();
  if ((lid < 8i)) {
    let t9: f32 = red[lid];
    let t10: f32 = red[(lid + 8i)];
    red[lid] = (t9 + t10);
  }
  workgroupBarrier();
  if ((lid < 4i)) {
    let t11: f32 = red[lid];
    let t12: f32 = red[(lid + 4i)];
    red[lid] = (t11 + t12);
  }
  workgroupBarrier();
  if ((lid < 2i)) {
    let t13: f32 = red[lid];
    let t14: f32 = red[(lid + 2i)];
    red[lid] = (t13 + t14);
  }
  workgroupBarrier();
  if ((lid < 1i)) {
    let t15: f32 = red[lid];
    let t16: f32 = red[(lid + 1i)];
    red[lid] = (t15 + t16);
  }
  workgroupBarrier();
  let r17: f32 = red[0i];
  workgroupBarrier();
  if ((lid == 0i)) {
    s0[(i32(prm.p1) + wg)] = bitcast<u32>(r17);
  }
}
