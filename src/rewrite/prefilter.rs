//! The first, cheap test of every statement: does it mention a ruled table at all?
//!
//! One aho-corasick automaton over the unqualified names of every ruled table,
//! ASCII case-insensitive, run over the raw statement bytes (which may be latin1).
//! A hit counts only as a whole identifier: the bytes on either side must not be
//! identifier bytes (so `hits_x` does not hit `hits`, while `` `hits` ``, `db.hits`
//! and `'hits'` do). A hit is only a candidate: the lexer then decides whether it is
//! an identifier or sits in a string or comment.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

use super::sqltok::is_ident_byte;

/// The compiled scanner. Pattern ids are indices into the name list it was built
/// from.
#[derive(Debug)]
pub struct Prefilter {
    /// Case-sensitive automaton over the lowercased names, run over a lowercased copy
    /// of the statement to answer "any name at all?". Case-sensitive leftmost
    /// searches get aho-corasick's SIMD prefilter; case-insensitive ones over several
    /// names do not, and are several times slower.
    quick: AhoCorasick,
    /// Case-insensitive automaton with overlapping search, to list the hits (only run
    /// when `quick` found something): `hits` inside `hits_daily` cannot hide a match
    /// of `hits_daily`.
    exact: AhoCorasick,
    /// Length of the longest name: consecutive lowercased chunks overlap by one less.
    longest: usize,
}

/// Statements up to this size are lowercased in one small stack buffer.
const SHORT: usize = 256;
/// Longer statements are lowercased in chunks of this size.
const CHUNK: usize = 4096;

impl Prefilter {
    /// Build a scanner for `names` (unqualified table names; the caller removes
    /// duplicates, compared ASCII case-insensitively).
    pub fn new<I, P>(names: I) -> Result<Self, aho_corasick::BuildError>
    where
        I: IntoIterator<Item = P>,
        P: AsRef<[u8]>,
    {
        let lower: Vec<Vec<u8>> = names
            .into_iter()
            .map(|n| n.as_ref().to_ascii_lowercase())
            .collect();
        let quick = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostFirst)
            .build(&lower)?;
        let exact = AhoCorasickBuilder::new()
            .ascii_case_insensitive(true)
            .match_kind(MatchKind::Standard)
            .build(&lower)?;
        let longest = lower.iter().map(Vec::len).max().unwrap_or(0);
        Ok(Prefilter {
            quick,
            exact,
            longest,
        })
    }

    /// Whether any name occurs in `sql`, ignoring ASCII case (boundaries unchecked).
    fn any(&self, sql: &[u8]) -> bool {
        fn lower_into<'b>(buf: &'b mut [u8], src: &[u8]) -> &'b [u8] {
            let out = &mut buf[..src.len()];
            for (d, s) in out.iter_mut().zip(src) {
                *d = s.to_ascii_lowercase();
            }
            out
        }
        if sql.len() <= SHORT {
            let mut buf = [0u8; SHORT];
            return self.quick.is_match(lower_into(&mut buf, sql));
        }
        let mut buf = vec![0u8; CHUNK];
        let overlap = self.longest.saturating_sub(1).min(CHUNK / 2);
        let mut at = 0;
        loop {
            let end = (at + CHUNK).min(sql.len());
            if self.quick.is_match(lower_into(&mut buf, &sql[at..end])) {
                return true;
            }
            if end == sql.len() {
                return false;
            }
            at = end - overlap;
        }
    }

    /// Ids of the names that occur in `sql` as whole identifiers, ascending and
    /// without duplicates. Empty (and allocation-free) when nothing occurs.
    pub fn scan(&self, sql: &[u8]) -> Vec<usize> {
        let mut hits = Vec::new();
        if !self.any(sql) {
            return hits;
        }
        let iter = match self.exact.try_find_overlapping_iter(sql) {
            Ok(iter) => iter,
            Err(_) => {
                // Not reachable with MatchKind::Standard; report every pattern so that
                // nothing is skipped.
                return (0..self.exact.patterns_len()).collect();
            }
        };
        for m in iter {
            let before = m.start().checked_sub(1).map(|i| sql[i]);
            let after = sql.get(m.end()).copied();
            if before.is_some_and(is_ident_byte) || after.is_some_and(is_ident_byte) {
                continue;
            }
            let id = m.pattern().as_usize();
            if let Err(pos) = hits.binary_search(&id) {
                hits.insert(pos, id);
            }
        }
        hits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pf() -> Prefilter {
        Prefilter::new(["hits", "hits_daily", "log"]).unwrap()
    }

    #[test]
    fn whole_identifiers_only() {
        let p = pf();
        assert_eq!(p.scan(b"SELECT * FROM hits WHERE id = 1"), vec![0]);
        assert_eq!(p.scan(b"SELECT * FROM HiTs"), vec![0]);
        assert_eq!(p.scan(b"SELECT * FROM hits_x"), Vec::<usize>::new());
        assert_eq!(p.scan(b"SELECT * FROM xhits"), Vec::<usize>::new());
        assert_eq!(p.scan(b"SELECT * FROM hits2"), Vec::<usize>::new());
        assert_eq!(p.scan(b"SELECT * FROM hits$"), Vec::<usize>::new());
        assert_eq!(p.scan(b"SELECT * FROM `hits`"), vec![0]);
        assert_eq!(p.scan(b"SELECT * FROM db.hits"), vec![0]);
        assert_eq!(p.scan(b"SELECT * FROM hits_daily"), vec![1]);
        assert_eq!(
            p.scan(b"SELECT * FROM hits_daily, hits, log"),
            vec![0, 1, 2]
        );
        assert_eq!(p.scan(b"hits"), vec![0]);
        assert_eq!(p.scan(b"SELECT a FROM t"), Vec::<usize>::new());
        // A string is still a hit here; the lexer rules it out later.
        assert_eq!(p.scan(b"SELECT 'hits'"), vec![0]);
        // Latin1 letters are identifier bytes.
        assert_eq!(p.scan(b"SELECT * FROM hits\xe9"), Vec::<usize>::new());
        assert_eq!(p.scan(b"SELECT * FROM \xe9hits"), Vec::<usize>::new());
    }

    #[test]
    fn long_statements_are_scanned_in_overlapping_chunks() {
        let p = pf();
        for pad in [0, 1, 4080, 4090, 4093, 4094, 4095, 4096, 4097, 9000] {
            let mut sql = b"SELECT ".to_vec();
            sql.extend(std::iter::repeat_n(b' ', pad));
            sql.extend_from_slice(b"HITS_DAILY");
            sql.extend(std::iter::repeat_n(b' ', 300));
            assert_eq!(p.scan(&sql), vec![1], "pad {pad}");
            let mut none = sql.clone();
            let at = none.len() - 301;
            none[at] = b'_';
            assert_eq!(p.scan(&none), Vec::<usize>::new(), "pad {pad}");
        }
    }

    /// A micro benchmark, not a test: `cargo test --release --lib prefilter_speed -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn prefilter_speed() {
        let sql =
            b"UPDATE visitors SET last_seen = NOW() WHERE visitor_id = 'abcdef0123' AND uid = 7";
        for names in [
            &["hits"][..],
            &["hits", "hits_daily", "log"],
            &["page_views", "event_log", "counters", "hits", "ring_events"],
        ] {
            let p = Prefilter::new(names).unwrap();
            let n = 1_000_000u32;
            let t = std::time::Instant::now();
            let mut found = 0usize;
            for _ in 0..n {
                found += std::hint::black_box(p.scan(std::hint::black_box(sql))).len();
            }
            println!(
                "{} names, {} bytes, no hit: {:?} per statement ({found})",
                names.len(),
                sql.len(),
                t.elapsed() / n
            );
        }
    }
}
