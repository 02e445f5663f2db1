//! Stripe's list pagination, over any objects that have an id and a creation time: newest
//! first (ties in creation order, newest first), at most `limit` per page, a cursor that is an
//! object id (`starting_after`: the page of older objects right after it; `ending_before`: the
//! page of newer objects right before it) and `created` bounds.
//!
//! Guarantee: walking `starting_after` from the first page (or `ending_before` from the last)
//! visits every object that existed throughout the walk exactly once, and `has_more` is false
//! only on the page that reaches the end in the direction of travel — what Stripe's libraries'
//! auto-pagination relies on to stop.

/// Stripe's default page size and its ceiling.
pub const DEFAULT_LIMIT: usize = 10;
pub const MAX_LIMIT: usize = 100;

/// What a list can page over.
pub trait Listed {
    fn id(&self) -> &str;
    /// Unix seconds.
    fn created(&self) -> i64;
}

/// `created[gt|gte|lt|lte]` (or `created=t`, both bounds at `t`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Created {
    pub gt: Option<i64>,
    pub gte: Option<i64>,
    pub lt: Option<i64>,
    pub lte: Option<i64>,
}

impl Created {
    fn contains(&self, t: i64) -> bool {
        self.gt.is_none_or(|b| t > b)
            && self.gte.is_none_or(|b| t >= b)
            && self.lt.is_none_or(|b| t < b)
            && self.lte.is_none_or(|b| t <= b)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cursor {
    /// `starting_after`: older than this object.
    After(String),
    /// `ending_before`: newer than this object.
    Before(String),
}

impl Cursor {
    pub fn param(&self) -> &'static str {
        match self {
            Cursor::After(_) => "starting_after",
            Cursor::Before(_) => "ending_before",
        }
    }

    fn id(&self) -> &str {
        match self {
            Cursor::After(id) | Cursor::Before(id) => id,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    /// 1..=[`MAX_LIMIT`], checked where the query is parsed.
    pub limit: usize,
    pub cursor: Option<Cursor>,
    pub created: Created,
}

impl Default for ListQuery {
    fn default() -> Self {
        Self {
            limit: DEFAULT_LIMIT,
            cursor: None,
            created: Created::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    pub data: Vec<T>,
    pub has_more: bool,
}

/// The cursor names an object that is not in the list (Stripe: `resource_missing` on the
/// cursor's parameter).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no such object for {param}: '{id}'")]
pub struct NoSuchCursor {
    pub param: &'static str,
    pub id: String,
}

/// One page of `items`, which come in creation order (oldest first).
pub fn page<'a, T, I>(items: I, q: &ListQuery) -> Result<Page<T>, NoSuchCursor>
where
    T: Listed + Clone + 'a,
    I: DoubleEndedIterator<Item = &'a T>,
{
    let mut newest_first: Vec<&T> = items.rev().collect();
    // Stable: among equal seconds the reversed creation order stays.
    newest_first.sort_by_key(|t| std::cmp::Reverse(t.created()));
    let limit = q.limit.max(1);
    let in_range = |t: &&T| q.created.contains(t.created());
    let Some(cursor) = &q.cursor else {
        return Ok(take_front(newest_first.into_iter().filter(in_range), limit));
    };
    let at = newest_first
        .iter()
        .position(|t| t.id() == cursor.id())
        .ok_or_else(|| NoSuchCursor {
            param: cursor.param(),
            id: cursor.id().to_owned(),
        })?;
    match cursor {
        Cursor::After(_) => Ok(take_front(
            newest_first.into_iter().skip(at + 1).filter(in_range),
            limit,
        )),
        Cursor::Before(_) => {
            // The `limit` objects just newer than the cursor, still newest first.
            let newer: Vec<&T> = newest_first[..at]
                .iter()
                .copied()
                .filter(in_range)
                .collect();
            let start = newer.len().saturating_sub(limit);
            Ok(Page {
                data: newer[start..].iter().map(|t| (*t).clone()).collect(),
                has_more: start > 0,
            })
        }
    }
}

fn take_front<'a, T: Clone + 'a>(mut it: impl Iterator<Item = &'a T>, limit: usize) -> Page<T> {
    let data: Vec<T> = it.by_ref().take(limit).cloned().collect();
    Page {
        has_more: it.next().is_some(),
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    struct Obj(String, i64);

    impl Listed for Obj {
        fn id(&self) -> &str {
            &self.0
        }
        fn created(&self) -> i64 {
            self.1
        }
    }

    /// o0..o(n-1), two per second, oldest first.
    fn objs(n: usize) -> Vec<Obj> {
        (0..n)
            .map(|i| Obj(format!("o{i}"), (i / 2) as i64))
            .collect()
    }

    fn ids(p: &Page<Obj>) -> Vec<&str> {
        p.data.iter().map(|o| o.0.as_str()).collect()
    }

    fn q(limit: usize, cursor: Option<Cursor>) -> ListQuery {
        ListQuery {
            limit,
            cursor,
            ..ListQuery::default()
        }
    }

    #[test]
    fn newest_first_with_has_more() {
        let all = objs(5);
        let p = page(all.iter(), &q(2, None)).expect("page");
        assert_eq!((ids(&p), p.has_more), (vec!["o4", "o3"], true));
        let p = page(all.iter(), &q(5, None)).expect("page");
        assert_eq!(
            (ids(&p), p.has_more),
            (vec!["o4", "o3", "o2", "o1", "o0"], false)
        );
        let none: [Obj; 0] = [];
        let p = page(none.iter(), &q(10, None)).map(|p| p.has_more);
        assert_eq!(p, Ok(false));
    }

    #[test]
    fn creation_time_wins_over_insertion_order() {
        // Inserted out of order by a second (two creates racing across a second boundary).
        let all = [Obj("a".into(), 7), Obj("b".into(), 6), Obj("c".into(), 7)];
        let p = page(all.iter(), &q(10, None)).expect("page");
        assert_eq!(ids(&p), ["c", "a", "b"]);
    }

    #[test]
    fn walking_either_way_visits_everything_once() {
        let all = objs(7);
        let mut seen = Vec::new();
        let mut cursor = None;
        loop {
            let p = page(all.iter(), &q(3, cursor)).expect("page");
            seen.extend(ids(&p).into_iter().map(str::to_owned));
            if !p.has_more {
                break;
            }
            cursor = p.data.last().map(|o| Cursor::After(o.0.clone()));
        }
        assert_eq!(seen, ["o6", "o5", "o4", "o3", "o2", "o1", "o0"]);
        // Backwards from the oldest.
        let mut seen = Vec::new();
        let mut cursor = Cursor::Before("o0".into());
        loop {
            let p = page(all.iter(), &q(3, Some(cursor.clone()))).expect("page");
            // Each page is newer than the ones before it.
            let mut newer: Vec<String> = ids(&p).into_iter().map(str::to_owned).collect();
            newer.append(&mut seen);
            seen = newer;
            if !p.has_more {
                break;
            }
            cursor = Cursor::Before(p.data[0].0.clone());
        }
        assert_eq!(seen, ["o6", "o5", "o4", "o3", "o2", "o1"]);
    }

    #[test]
    fn created_bounds_and_unknown_cursors() {
        let all = objs(8); // created 0,0,1,1,2,2,3,3
        let mut query = q(10, None);
        query.created = Created {
            gte: Some(1),
            lt: Some(3),
            ..Created::default()
        };
        let p = page(all.iter(), &query).expect("page");
        assert_eq!(ids(&p), ["o5", "o4", "o3", "o2"]);
        query.cursor = Some(Cursor::After("o4".into()));
        assert_eq!(ids(&page(all.iter(), &query).expect("page")), ["o3", "o2"]);
        let e = page(all.iter(), &q(10, Some(Cursor::Before("nope".into()))));
        assert_eq!(
            e,
            Err(NoSuchCursor {
                param: "ending_before",
                id: "nope".into()
            })
        );
    }
}
