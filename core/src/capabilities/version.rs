//! Library versions, as capability files bound a kernel to them (`library_versions`) and
//! loaders read them from a library.

/// A library version, `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version(pub u32, pub u32, pub u32);

impl Version {
    /// Parses `3`, `3.2` or `3.2.0`.
    pub fn parse(text: &str) -> Option<Version> {
        let mut parts = text.trim().split('.').map(|p| p.parse::<u32>().ok());
        let major = parts.next()??;
        let minor = parts.next().unwrap_or(Some(0))?;
        let patch = parts.next().unwrap_or(Some(0))?;
        parts.next().is_none().then_some(Version(major, minor, patch))
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_order() {
        assert_eq!(Version::parse("3.2"), Some(Version(3, 2, 0)));
        assert_eq!(Version::parse("3.14.1"), Some(Version(3, 14, 1)));
        assert!(Version::parse("3.x").is_none() && Version::parse("3.2.0.1").is_none());
        assert!(Version(3, 14, 0) > Version(3, 2, 9));
    }
}
