// softmax: 4 workgroups of 64
fn chroma_f32_bits(b: u32) -> f32 { return bitcast<f32>(b); }
@group(0) @binding(1) var<storage, read_write> s0: array<u32>;
struct Params { p0: u32, p1: u32, }
@group(0) @binding(0) var<uniform> prm: Params;
var<workgroup> red: array<f32, 64>;
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lidx: u32, @builtin(workgroup_id) wgid: vec3<u32>) {
  let lid = i32(lidx);
  let wg = i32(wgid.x + wgid.y * 4u);
  var m0: f32 = chroma_f32_bits(4286578688u);
  for (var r1: i32 = lid; r1 < 64i; r1 += 64i) {
    let t2: f32 = bitcast<f32>(s0[((i32(prm.p0) + (wg * 64i)) + r1)]);
    m0 = select(select(t2, m0, (m0 > t2)), (m0 + t2), (((bitcast<u32>(m0) & 2147483647u) > 2139095040u) || ((bitcast<u32>(t2) & 2147483647u) > 2139095040u)));
  }
  red[lid] = m0;
  workgroupBarrier();
  if ((lid < 32i)) {
    let t3: f32 = red[lid];
    let t4: f32 = red[(lid + 32i)];
    red[lid] = select(select(t4, t3, (t3 > t4)), (t3 + t4), (((bitcast<u32>(t3) & 2147483647u) > 2139095040u) || ((bitcast<u32>(t4) & 2147483647u) > 2139095040u)));
  }
  workgroupBarrier();
  if ((lid < 16i)) {
    let t5: f32 = red[lid];
    let t6: f32 = red[(lid + 16i)];
    red[lid] = select(select(t6, t5, (t5 > t6)), (t5 + t6), (((bitcast<u32>(t5) & 2147483647u) > 2139095040u) || ((bitcast<u32>(t6) & 2147483647u) > 2139095040u)));
  }
  workgroupBarrier();
  if ((lid < 8i)) {
    let t7: f32 = red[lid];
    let t8: f32 = red[(lid + 8i)];
    red[lid] = select(select(t8, t7, (t7 > t8)), (t7 + t8), (((bitcast<u32>(t7) & 2147483647u) > 2139095040u) || ((bitcast<u32>(t8) & 2147483647u) > 2139095040u)));
  }
  workgroupBarrier();
  if ((lid < 4i)) {
    let t9: f32 = red[lid];
    let t10: f32 = red[(lid + 4i)];
    red[lid] = select(select(t10, t9, (t9 > t10)), (t9 + t10), (((bitcast<u32>(t9) & 2147483647u) > 2139095040u) || ((bitcast<u32>(t10) & 2147483647u) > 2139095040u)));
  }
  workgroupBarrier();
  if ((lid < 2i)) {
    let t11: f32 = red[lid];
    let t12: f32 = red[(lid + 2i)];
    red[lid] = select(select(t12, t11, (t11 > t12)), (t11 + t12), (((bitcast<u32>(t11) & 2147483647u) > 2139095040u) || ((bitcast<u32>(t12) & 2147483647u) > 2139095040u)));
  }
  workgroupBarrier();
  if ((lid < 1i)) {
    let t13: f32 = red[lid];
    let t14: f32 = red[(lid + 1i)];
    red[lid] = select(select(t14, t13, (t13 > t14)), (t13 + t14), (((bitcast<u32>(t13) & 2147483647u) > 2139095040u) || ((bitcast<u32>(t14) & 2147483647u) > 2139095040u)));
  }
  workgroupBarrier();
  let r15: f32 = red[0i];
  workgroupBarrier();
  var s16: f32 = 0.0f;
  for (var r17: i32 = lid; r17 < 64i; r17 += 64i) {
    s16 = (s16 + exp((bitcast<f32>(s0[((i32(prm.p0) + (wg * 64i)) + r17)]) - r15)));
  }
  red[lid] = s16;
  workgroupBarrier();
  if ((lid < 32i)) {
    let t18: f32 = red[lid];
    let t19: f32 = red[(lid + 32i)];
    red[lid] = (t18 + t19);
  }
  workgroupBarrier();
  if ((lid < 16i)) {
    let t20: f32 = red[lid];
    let t21: f32 = red[(lid + 16i)];
    red[lid] = (t20 + t21);
  }
  workgroupBarrier();
  if ((lid < 8i)) {
    let t22: f32 = red[lid];
    let t23: f32 = red[(lid + 8i)];
    red[lid] = (t22 + t23);
  }
  workgroupBarrier();
  if ((lid < 4i)) {
    let t24: f32 = red[lid];
    let t25: f32 = red[(lid + 4i)];
    red[lid] = (t24 + t25);
  }
  workgroupBarrier();
  if ((lid < 2i)) {
    let t26: f32 = red[lid];
    let t27: f32 = red[(lid + 2i)];
    red[lid] = (t26 + t27);
  }
  workgroupBarrier();
  if ((lid < 1i)) {
    let t28: f32 = red[lid];
    let t29: f32 = red[(lid + 1i)];
    red[lid] = (t28 + t29);
  }
  workgroupBarrier();
  let r30: f32 = red[0i];
  workgroupBarrier();
  for (var r31: i32 = lid; r31 < 64i; r31 += 64i) {
    let t32: f32 = (bitcast<f32>(s0[((i32(prm.p0) + (wg * 64i)) + r31)]) - r15);
    s0[((i32(prm.p1) + (wg * 64i)) + r31)] = bitcast<u32>((exp(t32) / r30));
  }
}
