//! Restoring per-linear quantizer states (FP8 delayed-scaling histories) from a checkpoint.

use crate::ops::linear::LinearQuantState;
use crate::{ParamId, ParamStore, Result};

impl ParamStore {
    /// Replaces the quantizer state of the linear layer whose weight is `id` (`None` clears
    /// it, as for a layer that has not run yet). Used to resume training exactly.
    ///
    /// ```
    /// use autograd::{LinearQuantState, ParamStore};
    /// let mut ps = ParamStore::new();
    /// let w = ps.add_zeros("w", &[2, 2])?;
    /// ps.set_linear_state(w, Some(LinearQuantState::default()))?;
    /// assert!(ps.linear_state(w)?.is_some());
    /// ps.set_linear_state(w, None)?;
    /// assert!(ps.linear_state(w)?.is_none());
    /// # Ok::<(), autograd::Error>(())
    /// ```
    pub fn set_linear_state(&mut self, id: ParamId, state: Option<LinearQuantState>) -> Result<()> {
        let i = self.check(id)?;
        self.states[i] = state.map(Box::new);
        Ok(())
    }
}
