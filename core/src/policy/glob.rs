//! `*` globs over kernel ids and profile names.

/// True when `text` matches `pattern`, where `*` matches any run of characters.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn star_matches_any_run_and_literals_must_match() {
        assert!(glob_match("flash_attn_*", "flash_attn_3.attention.fwd"));
        assert!(glob_match("*.attention.*", "cpu.attention.flash"));
        assert!(glob_match("cpu.attention.flash", "cpu.attention.flash"));
        assert!(!glob_match("cpu.attention.flash", "cpu.attention.flash2"));
        assert!(!glob_match("flash_attn_2*", "flash_attn_3.attention.fwd"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("a*b", "acbd"));
    }
}
