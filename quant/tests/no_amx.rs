//! `NIBBLE_NO_AMX` keeps the AMX tile unit unused: the quantized GEMM then computes the pair
//! arithmetic of a CPU without AMX, bit for bit. The variable is read once per process, so
//! this file holds one test, which sets it before anything asks for the CPU's features.

use quant::gemm::bf16::{
    bf16_gemm_tn_portable, quantized_gemm_arithmetic, quantized_gemm_tn, Bf16Arithmetic,
    Bf16Workspace,
};
use quant::gemm::MatRef;

#[test]
fn without_amx_the_quantized_gemm_computes_the_pair_arithmetic() {
    std::env::set_var(fp_formats::cpu::NO_AMX_ENV, "1");
    assert!(!fp_formats::cpu::has_amx_bf16());
    let pairs_native = Bf16Arithmetic::Pairs.native();
    assert_eq!(
        quantized_gemm_arithmetic(),
        pairs_native.then_some(Bf16Arithmetic::Pairs)
    );
    if !pairs_native {
        eprintln!("SKIP: no BF16 unit and no AVX2 + FMA here: the product runs on the f32 GEMM");
        return;
    }
    // values spanning 2^-20 .. 2^20, so that the order of the sums shows in the last bits
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let mag = ((s >> 11) % 41) as i32 - 20;
        let sign = if s & 1 == 0 { 1.0 } else { -1.0 };
        sign * (1.0 + (s >> 40) as f32 / (1u64 << 24) as f32) * 2f32.powi(mag)
    };
    let (m, n, k) = (70, 45, 1000);
    let a: Vec<f32> = (0..m * k).map(|_| rnd()).collect();
    let b: Vec<f32> = (0..n * k).map(|_| rnd()).collect();
    let (av, bv) = (MatRef::row_major(&a, m, k), MatRef::row_major(&b, n, k));
    let mut ws = Bf16Workspace::new();
    let mut got = vec![f32::NAN; m * n];
    quantized_gemm_tn(av, bv, &mut got, &mut ws);
    let model = |arith| {
        let mut c = vec![f32::NAN; m * n];
        bf16_gemm_tn_portable(arith, av, bv, &mut c, &mut Bf16Workspace::new());
        c
    };
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got), bits(&model(Bf16Arithmetic::Pairs)));
    // the data tells the two arithmetics apart, so the check above has teeth
    assert_ne!(bits(&got), bits(&model(Bf16Arithmetic::Tiles)));
}
