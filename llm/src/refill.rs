//! Small tensors a forward pass builds every call (token ids, positions, block tables, f32
//! logits), rewritten in place so that a warm call allocates nothing for them.

use layerzero::error::Result;
use layerzero::tensor::{HostTensor, Storage};

/// A tensor of `shape` holding `values`, written into `slot`'s storage when it is unshared
/// and has room (no allocation), else new; `slot` keeps a handle for next time.
macro_rules! refill {
    ($fn:ident, $t:ty, $variant:ident) => {
        pub(crate) fn $fn(
            slot: &mut Option<HostTensor>,
            values: impl Iterator<Item = $t>,
            shape: &[usize],
        ) -> Result<HostTensor> {
            let n: usize = shape.iter().product();
            if let Some(old) = slot.take() {
                let mut shared = old.into_shared();
                if let Some(Storage::$variant(buf)) = std::sync::Arc::get_mut(&mut shared)
                    && !buf.is_mapped()
                    && buf.vec_mut().capacity() >= n
                {
                    let v = buf.vec_mut();
                    v.clear();
                    v.extend(values.take(n));
                    let t = HostTensor::from_shared(shared, shape)?;
                    *slot = Some(t.clone());
                    return Ok(t);
                }
            }
            let t = HostTensor::new(Storage::$variant(values.take(n).collect()), shape)?;
            *slot = Some(t.clone());
            Ok(t)
        }
    };
}
refill!(refill_i64, i64, I64);
refill!(refill_i32, i32, I32);
refill!(refill_f32, f32, F32);
