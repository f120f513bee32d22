// matmul: 4 workgroups of 256
fn chroma_f32_bits(b: u32) -> f32 { return bitcast<f32>(b); }
@group(0) @binding(1) var<storage, read_write> s0: array<u32>;
struct Params { p0: u32, p1: u32, p2: u32, }
@group(0) @binding(0) var<uniform> prm: Params;
var<workgroup> ta: array<f32, 256>;
var<workgroup> tb: array<f32, 512>;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lidx: u32, @builtin(workgroup_id) wgid: vec3<u32>) {
  let lid = i32(lidx);
  let wg = i32(wgid.x + wgid.y * 4u);
  let bt0: i32 = (wg / 4i);
  let t1: i32 = (wg % 4i);
  let m02: i32 = ((t1 / 2i) * 32i);
  let n03: i32 = ((t1 % 2i) * 64i);
  let t4: i32 = (lid / 16i);
  let t5: i32 = (lid % 16i);
  var acc: array<f32, 8>;
  acc[0i] = 0.0f;
  acc[1i] = 0.0f;
  acc[2i] = 0.0f;
  acc[3i] = 0.0f;
  acc[4i] = 0.0f;
  acc[5i] = 0.0f;
  acc[6i] = 0.0f;
  acc[7i] = 0.0f;
  for (var k06: i32 = 0i; k06 < 24i; k06 += 8i) {
    for (var s7: i32 = 0i; s7 < 1i; s7 += 1i) {
      let t8: i32 = (lid + (s7 * 256i));
      let t9: i32 = (t8 / 8i);
      let t10: i32 = (t8 % 8i);
      let t11: i32 = (m02 + t9);
      let t12: i32 = (k06 + t10);
      var av13: f32 = 0.0f;
      if (((t11 < 40i) && (t12 < 24i))) {
        av13 = bitcast<f32>(s0[((i32(prm.p0) + (t11 * 24i)) + t12)]);
      }
      ta[((t9 * 8i) + t10)] = av13;
    }
    for (var s14: i32 = 0i; s14 < 2i; s14 += 1i) {
      let t15: i32 = (lid + (s14 * 256i));
      let t16: i32 = (t15 / 64i);
      let t17: i32 = (t15 % 64i);
      let t18: i32 = (k06 + t16);
      let t19: i32 = (n03 + t17);
      var bv20: f32 = 0.0f;
      if (((t18 < 24i) && (t19 < 72i))) {
        bv20 = bitcast<f32>(s0[((i32(prm.p1) + (t18 * 72i)) + t19)]);
      }
      tb[((t16 * 64i) + t17)] = bv20;
    }
    workgroupBarrier();
    for (var kk21: i32 = 0i; kk21 < 8i; kk21 += 1i) {
      let a22: f32 = ta[((t4 * 8i) + kk21)];
      let a23: f32 = ta[(((t4 + 16i) * 8i) + kk21)];
      let b24: f32 = tb[((kk21 * 64i) + t5)];
      let b25: f32 = tb[(((kk21 * 64i) + t5) + 16i)];
      let b26: f32 = tb[(((kk21 * 64i) + t5) + 32i)];
      let b27: f32 = tb[(((kk21 * 64i) + t5) + 48i)];
      acc[0i] = (acc[0i] + (a22 * b24));
      acc[1i] = (acc[1i] + (a22 * b25));
      acc[2i] = (acc[2i] + (a22 * b26));
      acc[3i] = (acc[3i] + (a22 * b27));
      acc[4i] = (acc[4i] + (a23 * b24));
      acc[5i] = (acc[5i] + (a23 * b25));
      acc[6i] = (acc[6i] + (a23 * b26));
      acc[7i] = (acc[7i] + (a23 * b27));
    }
    workgroupBarrier();
  }
  for (var o28: i32 = 0i; o28 < 8i; o28 += 1i) {
    let gm29: i32 = ((m02 + t4) + ((o28 / 4i) * 16i));
    let gn30: i32 = ((n03 + t5) + ((o28 % 4i) * 16i));
    if (((gm29 < 40i) && (gn30 < 72i))) {
      let t31: f32 = acc[o28];
      let t32: f32 = (t31 + 1.0f);
      let t33: f32 = select(t32, 0.0f, (t32 < 0.0f));
      s0[((i32(prm.p2) + (gm29 * 72i)) + gn30)] = bitcast<u32>(t33);
    }
  }
}
