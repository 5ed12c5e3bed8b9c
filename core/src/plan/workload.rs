//! Workloads: the ops a deployment runs, each as a request template plus the ranges of its
//! perf axes (`schemas/workload.schema.json`). `lz tune` measures and `lz solve` decides
//! every bucket a workload covers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::key::axes;
use crate::key::{Buckets, SelectionKey};
use crate::model::request::Request;

/// Current workload schema version.
pub const WORKLOAD_SCHEMA_VERSION: u32 = 1;

/// A workload file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Schema version (1).
    pub schema_version: u32,
    /// A short name.
    pub name: String,
    /// What it models.
    #[serde(default)]
    pub description: String,
    /// The identity hash of the model's tokenizer, for a model's workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer_hash: Option<String>,
    /// The ops.
    pub entries: Vec<Entry>,
}

/// One op of a workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// A name unique in the workload (`layer.attention.prefill`).
    pub name: String,
    /// The request at any size; its perf axes are replaced per bucket.
    pub request: serde_json::Value,
    /// Per perf axis: `[min, max]` (inclusive) or the name of another axis it equals.
    /// Axes not named keep the template's value.
    #[serde(default)]
    pub ranges: BTreeMap<String, AxisRange>,
}

/// The range of one perf axis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum AxisRange {
    /// Inclusive bounds.
    Span([u64; 2]),
    /// Equal to another axis at every point (self-attention prefill: `seq_k` = `seq_q`).
    Tie(String),
}

/// One bucket of one workload entry: the request measured and solved for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// The entry's name.
    pub entry: String,
    /// The representative request: each axis at its bucket's upper edge, clipped to the range.
    pub request: Request,
    /// Its key.
    pub key: SelectionKey,
    /// Its buckets.
    pub buckets: Buckets,
}

impl Workload {
    /// Parses and schema-checks a workload document.
    pub fn from_json(text: &str, source: &str) -> Result<Workload> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| Error::invalid(format!("{source}: invalid JSON: {e}")))?;
        crate::schema::validate(crate::schema::SchemaKind::Workload, &value, source)?;
        let w: Workload = serde_path_to_error::deserialize(value)
            .map_err(|e| Error::invalid(format!("{source}: field `{}`: {}", e.path(), e.inner())))?;
        if w.schema_version != WORKLOAD_SCHEMA_VERSION {
            return Err(Error::invalid(format!(
                "{source}: schema_version {} is not supported (this layerzero reads {WORKLOAD_SCHEMA_VERSION})",
                w.schema_version
            )));
        }
        let mut seen = std::collections::BTreeSet::new();
        for e in &w.entries {
            if !seen.insert(e.name.as_str()) {
                return Err(Error::invalid(format!("{source}: entry name `{}` appears twice", e.name)));
            }
        }
        Ok(w)
    }

    /// Reads and checks a workload file; errors name the file and the field. The points are
    /// resolved here too, so a bad range or request fails before any timing or solving.
    pub fn load(path: &std::path::Path) -> Result<Workload> {
        let source = path.display().to_string();
        let text = crate::files::read_to_string(path).map_err(|e| e.context("workload"))?;
        let w = Workload::from_json(&text, &source)?;
        w.points().map_err(|e| e.context(&source))?;
        Ok(w)
    }

    /// Every (entry, bucket) the workload covers, in entry order then bucket order;
    /// duplicates (same key and buckets as an earlier point) are dropped.
    pub fn points(&self) -> Result<Vec<Point>> {
        let mut out: Vec<Point> = Vec::new();
        for e in &self.entries {
            for p in e.points()? {
                if !out.iter().any(|q| q.key.validity == p.key.validity && q.buckets == p.buckets) {
                    out.push(p);
                }
            }
        }
        Ok(out)
    }
}

impl Entry {
    /// The entry's template request.
    pub fn template(&self) -> Result<Request> {
        Request::from_value(self.request.clone()).map_err(|e| e.context(&format!("entry `{}`", self.name)))
    }

    /// The points of this entry.
    pub fn points(&self) -> Result<Vec<Point>> {
        let template = self.template()?;
        let axes = axes::axes(template.op);
        let where_ = |m: String| Error::invalid(format!("entry `{}`: {m}", self.name));
        for name in self.ranges.keys() {
            if !axes.iter().any(|a| a.name == name) {
                let names: Vec<&str> = axes.iter().map(|a| a.name).collect();
                return Err(where_(format!(
                    "ranges.{name}: {} has no perf axis `{name}` (its axes: [{}])",
                    template.op,
                    names.join(", ")
                )));
            }
        }
        let Some((base, n)) = axes::values(&template) else {
            return Err(where_(format!("the {} request lacks the tensors that carry its perf axes", template.op)));
        };
        // Per axis: the candidate values (one per bucket), or a tie to an earlier-resolved axis.
        let mut choices: Vec<Vec<u64>> = Vec::with_capacity(n);
        let mut ties: Vec<Option<usize>> = vec![None; n];
        for (i, axis) in axes.iter().enumerate() {
            match self.ranges.get(axis.name) {
                None => choices.push(vec![base[i]]),
                Some(AxisRange::Span([lo, hi])) => {
                    if lo > hi || *lo == 0 {
                        return Err(where_(format!("ranges.{}: [{lo}, {hi}] is not a range of sizes >= 1", axis.name)));
                    }
                    let buckets = axis.anchor.covering(*lo, *hi);
                    if buckets.is_empty() {
                        return Err(where_(format!(
                            "ranges.{}: [{lo}, {hi}] is beyond the largest bucketed size {}",
                            axis.name, axis.anchor.max
                        )));
                    }
                    choices.push(buckets.iter().map(|&b| axis.anchor.range(b).1.clamp(*lo, *hi)).collect());
                }
                Some(AxisRange::Tie(other)) => {
                    let Some(j) = axes.iter().position(|a| a.name == other) else {
                        return Err(where_(format!("ranges.{}: `{other}` is not a perf axis", axis.name)));
                    };
                    if matches!(self.ranges.get(other.as_str()), Some(AxisRange::Tie(_))) || j == i {
                        return Err(where_(format!("ranges.{}: ties must name an axis with its own range", axis.name)));
                    }
                    ties[i] = Some(j);
                    choices.push(Vec::new());
                }
            }
        }
        let mut points = Vec::new();
        let mut idx = vec![0usize; n];
        loop {
            let mut values = [0u64; axes::MAX_AXES];
            for i in 0..n {
                if ties[i].is_none() {
                    values[i] = choices[i][idx[i]];
                }
            }
            for i in 0..n {
                if let Some(j) = ties[i] {
                    values[i] = values[j];
                }
            }
            let request =
                axes::resize(&template, &values[..n]).map_err(|e| e.context(&format!("entry `{}`", self.name)))?;
            let key = SelectionKey::derive(&request);
            if let Some(buckets) = key.buckets() {
                points.push(Point { entry: self.name.clone(), request, key, buckets });
            }
            // Odometer over the free axes.
            let mut i = 0;
            loop {
                if i == n {
                    return Ok(points);
                }
                if ties[i].is_none() && idx[i] + 1 < choices[i].len() {
                    idx[i] += 1;
                    break;
                }
                idx[i] = 0;
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;

    const PREFILL: &str = r#"{
        "schema_version": 1, "name": "t",
        "entries": [{
            "name": "attn",
            "request": {"op": "attention", "tensors": {
                "q": {"dtype": "f32", "shape": [1, 16, 4, 64], "layout": "BSHD"},
                "k": {"dtype": "f32", "shape": [1, 16, 2, 64], "layout": "BSHD"},
                "v": {"dtype": "f32", "shape": [1, 16, 2, 64], "layout": "BSHD"}},
                "attrs": {"causal": true}},
            "ranges": {"batch": [1, 2], "seq_q": [100, 1000], "seq_k": "seq_q"}
        }]
    }"#;

    #[test]
    fn a_range_yields_one_point_per_bucket_at_its_upper_edge_clipped() -> TestResult {
        let w = Workload::from_json(PREFILL, "t.json")?;
        let pts = w.points()?;
        // batch {1, 2} x seq {100..128, ..256, ..512, ..1000}
        assert_eq!(pts.len(), 8);
        let seqs: Vec<u64> = pts.iter().filter(|p| p.key.perf[0] == 1).map(|p| p.key.perf[1]).collect();
        assert_eq!(seqs, [128, 256, 512, 1000]);
        assert!(pts.iter().all(|p| p.key.perf[1] == p.key.perf[2]), "seq_k is tied to seq_q");
        Ok(())
    }

    #[test]
    fn an_unknown_axis_is_an_error_naming_it() -> TestResult {
        let text = PREFILL.replace("\"batch\": [1, 2]", "\"tokens\": [1, 2]");
        let e = Workload::from_json(&text, "t.json")?.points().err().ok_or("an unknown axis must be refused")?;
        assert!(e.to_string().contains("ranges.tokens"), "{e}");
        Ok(())
    }
}
