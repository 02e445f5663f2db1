//! Identifier generation. Ids are strings on the wire; we use UUIDv7 so they sort by creation
//! time (friendly to B-tree indexes) and cannot be guessed.

/// A new time-ordered, unguessable id.
pub fn new_id() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

/// True when `s` is a valid slug-style id (`[a-z0-9-_]`, 1..=64 chars). Used for ids that
/// appear in paths and Redis keys, so that no input can smuggle `{`, `}`, `:` or `/` into a key.
pub fn is_valid_slug(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_slugs() {
        let a = new_id();
        let b = new_id();
        assert_ne!(a, b);
        assert!(is_valid_slug(&a));
    }

    #[test]
    fn slug_rules() {
        assert!(is_valid_slug("tour-2027_tokyo"));
        assert!(!is_valid_slug(""));
        assert!(!is_valid_slug("a{b}"));
        assert!(!is_valid_slug("A"));
        assert!(!is_valid_slug(&"a".repeat(65)));
    }
}
