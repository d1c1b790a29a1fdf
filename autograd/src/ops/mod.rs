//! The op set. Each file holds one op family: its `Graph` method (shape checks, recording),
//! its CPU forward and backward kernels, and its finite-difference gradient check.

pub mod activation;
pub mod attention;
pub mod attention_cached;
pub mod attention_products;
pub mod attention_qkv;
pub mod cross_entropy;
pub(crate) mod device;
pub mod elementwise;
pub mod embedding;
pub mod linear;
pub mod matmul;
pub mod norm;
pub mod reduce;
pub mod rope;
pub mod round_bf16;
pub mod shape_ops;

#[cfg(test)]
pub(crate) mod test_util {
    use crate::gradcheck::{check_gradients, GradCheck};
    use crate::{Graph, ParamStore, Result, Tensor};

    /// Runs a gradient check with the default settings and asserts it passes.
    pub(crate) fn assert_gradcheck<F>(ps: &mut ParamStore, f: F)
    where
        F: Fn(&mut Graph<'_>) -> Result<Tensor>,
    {
        assert_gradcheck_with(ps, f, GradCheck::default());
    }

    pub(crate) fn assert_gradcheck_with<F>(ps: &mut ParamStore, f: F, cfg: GradCheck)
    where
        F: Fn(&mut Graph<'_>) -> Result<Tensor>,
    {
        let rep = check_gradients(ps, f, &cfg).expect("gradient check ran");
        assert!(rep.passed(), "{rep}");
    }
}
