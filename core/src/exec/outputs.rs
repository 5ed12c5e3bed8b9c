//! A kernel's named outputs: a few (name, tensor) pairs kept inline, so a dispatch that
//! returns them allocates nothing, and so a caller can hand buffers in to be written
//! ([`LayerZero::dispatch_into`](crate::LayerZero::dispatch_into)).

use std::collections::BTreeMap;

use smallvec::SmallVec;

use crate::tensor::HostTensor;

/// Named output tensors (`out`; RoPE also `out_k`; rms_norm with a residual also
/// `residual_out`; quantize also `scale`; sample `tokens`; moe_route `experts`, `weights`).
/// In insertion order; a name appears once.
#[derive(Debug, Clone, Default)]
pub struct Outputs {
    items: SmallVec<[(&'static str, HostTensor); 2]>,
}

impl Outputs {
    /// No outputs.
    pub fn new() -> Outputs {
        Outputs::default()
    }

    /// One output.
    pub fn one(name: &'static str, t: HostTensor) -> Outputs {
        let mut o = Outputs::new();
        o.items.push((name, t));
        o
    }

    /// Sets `name`, returning what it held.
    pub fn insert(&mut self, name: &'static str, t: HostTensor) -> Option<HostTensor> {
        match self.items.iter_mut().find(|(n, _)| *n == name) {
            Some((_, slot)) => Some(std::mem::replace(slot, t)),
            None => {
                self.items.push((name, t));
                None
            }
        }
    }

    /// The output called `name`.
    pub fn get(&self, name: &str) -> Option<&HostTensor> {
        self.items.iter().find(|(n, _)| *n == name).map(|(_, t)| t)
    }

    /// Takes the output called `name` out.
    pub fn remove(&mut self, name: &str) -> Option<HostTensor> {
        let i = self.items.iter().position(|(n, _)| *n == name)?;
        Some(self.items.remove(i).1)
    }

    /// True when `name` is set.
    pub fn contains_key(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// How many outputs there are.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The outputs, in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &HostTensor)> {
        self.items.iter().map(|(n, t)| (*n, t))
    }

    /// The tensors, mutably, in insertion order.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut HostTensor> {
        self.items.iter_mut().map(|(_, t)| t)
    }

    /// The names, in insertion order.
    pub fn keys(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.items.iter().map(|(n, _)| *n)
    }

    /// The outputs by name (for files and reports, which want a stable order).
    pub fn into_map(self) -> BTreeMap<String, HostTensor> {
        self.items.into_iter().map(|(n, t)| (n.to_owned(), t)).collect()
    }
}

impl IntoIterator for Outputs {
    type Item = (&'static str, HostTensor);
    type IntoIter = smallvec::IntoIter<[(&'static str, HostTensor); 2]>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.into_iter()
    }
}

impl FromIterator<(&'static str, HostTensor)> for Outputs {
    fn from_iter<I: IntoIterator<Item = (&'static str, HostTensor)>>(iter: I) -> Outputs {
        let mut o = Outputs::new();
        for (n, t) in iter {
            o.insert(n, t);
        }
        o
    }
}

impl<const N: usize> From<[(&'static str, HostTensor); N]> for Outputs {
    fn from(items: [(&'static str, HostTensor); N]) -> Outputs {
        items.into_iter().collect()
    }
}

impl<'a> IntoIterator for &'a Outputs {
    type Item = (&'static str, &'a HostTensor);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (&'static str, HostTensor)>,
        fn(&'a (&'static str, HostTensor)) -> (&'static str, &'a HostTensor),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.items.iter().map(|(n, t)| (*n, t))
    }
}

/// `outputs["out"]`: the output called so; panics when it is missing (as a map does), so
/// for tests and callers that have just checked.
impl std::ops::Index<&str> for Outputs {
    type Output = HostTensor;

    fn index(&self, name: &str) -> &HostTensor {
        self.get(name).unwrap_or_else(|| panic!("no output called `{name}`"))
    }
}
