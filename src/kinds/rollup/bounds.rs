//! The literals of a rollup read's two-step form ([`crate::rewrite::Prelude`]): the
//! range's bounds as the server computed them, and the bucket boundaries the read
//! is split at, picked here from those values.
//!
//! Any boundary on a level's bucket grid keeps the read exact (see
//! `Shape::prelude_sql` in `read/render.rs`); the pick only decides how many rows
//! are read. So this is plain calendar arithmetic on the wall-clock values a
//! DATETIME holds (no time zone is involved: the server converted `NOW()` already).

use super::spec::Bucket;
use crate::kinds::calendar::{civil, days_from_civil, days_in_month};
use crate::rewrite::PreludeValues;
use crate::wire::resultset::types;

/// The literals of one read's prelude row. The row: the lower bound, the upper
/// bound (each as `DATETIME(6)`, when the read has it) and, with an upper bound,
/// `NOW()`. The literals, in this order: each bound present, then for each level
/// (the rollup's bucket, then the finer rollup's, if any) its lower and upper
/// boundary (each when that bound is present).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Bounds {
    pub lower: bool,
    pub upper: bool,
    /// Bucket of each level, coarsest first.
    pub levels: Vec<Bucket>,
}

/// Microseconds in a day.
const DAY_US: i64 = 86_400_000_000;

/// A wall-clock value: days since 1970-01-01 and microseconds into the day.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Wall {
    days: i64,
    us: i64,
}

impl Wall {
    /// `YYYY-MM-DD HH:MM:SS[.f…]`, a valid date from year 1000 on.
    fn parse(text: &[u8]) -> Option<Wall> {
        let s = std::str::from_utf8(text).ok()?;
        let (date, time) = s.split_once(' ')?;
        let num = |t: &str, len: usize| -> Option<i64> {
            (t.len() == len && t.bytes().all(|b| b.is_ascii_digit()))
                .then(|| t.parse().ok())
                .flatten()
        };
        let mut d = date.split('-');
        let (y, m, day) = (num(d.next()?, 4)?, num(d.next()?, 2)?, num(d.next()?, 2)?);
        if d.next().is_some() || !(1000..=9999).contains(&y) || !(1..=12).contains(&m) {
            return None;
        }
        if day < 1 || day > days_in_month(y, m) {
            return None;
        }
        let (hms, frac) = match time.split_once('.') {
            Some((hms, f))
                if (1..=6).contains(&f.len()) && f.bytes().all(|b| b.is_ascii_digit()) =>
            {
                (hms, f.parse::<i64>().ok()? * 10i64.pow(6 - f.len() as u32))
            }
            Some(_) => return None,
            None => (time, 0),
        };
        let mut t = hms.split(':');
        let (h, mi, sec) = (num(t.next()?, 2)?, num(t.next()?, 2)?, num(t.next()?, 2)?);
        if t.next().is_some() || h > 23 || mi > 59 || sec > 59 {
            return None;
        }
        Some(Wall {
            days: days_from_civil(y, m, day),
            us: ((h * 60 + mi) * 60 + sec) * 1_000_000 + frac,
        })
    }

    /// A `TIMESTAMP'…'` (DATETIME) literal with six fractional digits; `None`
    /// outside years 1000–9999.
    fn literal(self) -> Option<String> {
        let (y, m, d) = civil(self.days);
        if !(1000..=9999).contains(&y) {
            return None;
        }
        let secs = self.us / 1_000_000;
        Some(format!(
            "TIMESTAMP'{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:06}'",
            secs / 3600,
            secs / 60 % 60,
            secs % 60,
            self.us % 1_000_000
        ))
    }

    /// The boundary of `bucket` at or before this value.
    fn floor(self, bucket: Bucket) -> Wall {
        match bucket {
            Bucket::Day => Wall {
                days: self.days,
                us: 0,
            },
            Bucket::Hour => Wall {
                days: self.days,
                us: self.us - self.us % 3_600_000_000,
            },
        }
    }

    /// The boundary `bucket` after `floor`.
    fn next(self, bucket: Bucket) -> Wall {
        let us = self.us + i64::from(bucket.seconds()) * 1_000_000;
        Wall {
            days: self.days + us / DAY_US,
            us: us % DAY_US,
        }
    }

    /// The nearest boundary (the later one at half way).
    fn round(self, bucket: Bucket) -> Wall {
        let f = self.floor(bucket);
        let n = f.next(bucket);
        if (self.days - f.days) * DAY_US + self.us - f.us
            >= (n.days - self.days) * DAY_US + n.us - self.us
        {
            n
        } else {
            f
        }
    }

    /// The boundary at or after this value.
    fn ceil(self, bucket: Bucket) -> Wall {
        let f = self.floor(bucket);
        if f == self {
            f
        } else {
            f.next(bucket)
        }
    }
}

/// The year of a valid `YYYY-MM-DD HH:MM:SS[.f…]` value from year 1000 on.
pub(super) fn valid_year(text: &[u8]) -> Option<i64> {
    let w = Wall::parse(text)?;
    Some(civil(w.days).0)
}

impl PreludeValues for Bounds {
    fn name(&self) -> &'static str {
        "rollup bounds"
    }

    fn literals(&self, row: &[Option<&[u8]>], column_types: &[u8]) -> Option<Vec<String>> {
        let mut cells = row.iter().zip(column_types).map(|(cell, t)| match *t {
            types::DATETIME => Wall::parse((*cell)?),
            _ => None,
        });
        let lower = if self.lower {
            Some(cells.next()??)
        } else {
            None
        };
        let upper = if self.upper {
            Some(cells.next()??)
        } else {
            None
        };
        let now = if self.upper {
            Some(cells.next()??)
        } else {
            None
        };
        if cells.next().is_some() {
            return None;
        }
        if let (Some(l), Some(u)) = (lower, upper) {
            // An empty or one-instant range: the one-step form answers it.
            if l >= u {
                return None;
            }
        }
        // Each level's boundaries, nearest to its bound (an upper bound at or after
        // NOW() rounds up: nothing is logged after NOW() yet), finest level first.
        // A level reads the finer level (or the log) between its boundaries and the
        // finer ones; when reading the finer level between the finer boundaries
        // alone is cheaper (a range without a whole bucket of this level), both of
        // its boundaries are the finer lower one: equal boundaries cancel.
        let cost = |a: Wall, b: Wall| -> i64 {
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            let hi = now.map_or(hi, |n| hi.min(n));
            if hi > lo {
                (hi.days - lo.days) * DAY_US + hi.us - lo.us
            } else {
                0
            }
        };
        let mut picked: Vec<(Option<Wall>, Option<Wall>)> = Vec::with_capacity(self.levels.len());
        let (mut finer_lo, mut finer_hi) = (lower, upper);
        for &b in self.levels.iter().rev() {
            // Any boundary on the grid is exact: one past 9999 gives way to the
            // one below.
            let printable = |w: Wall, v: Wall| if w.literal().is_some() { w } else { v.floor(b) };
            let lo = lower.map(|l| printable(l.round(b), l));
            let hi = upper.map(|u| {
                let w = if now.is_some_and(|n| u >= n) {
                    u.ceil(b)
                } else {
                    u.round(b)
                };
                printable(w, u)
            });
            let pair = match (lo, hi, finer_lo, finer_hi) {
                (Some(l), Some(h), Some(fl), Some(fh))
                    if l == h || cost(fl, fh) <= cost(fl, l) + cost(h, fh) =>
                {
                    (finer_lo, finer_lo)
                }
                _ => (lo, hi),
            };
            (finer_lo, finer_hi) = pair;
            picked.push(pair);
        }
        picked.reverse();
        let mut out = Vec::with_capacity(2 + 2 * picked.len());
        for w in [lower, upper].into_iter().flatten() {
            out.push(w.literal()?);
        }
        for (lo, hi) in picked {
            for w in [lo, hi].into_iter().flatten() {
                out.push(w.literal()?);
            }
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lits(b: &Bounds, cells: &[&str]) -> Option<Vec<String>> {
        let row: Vec<Option<&[u8]>> = cells.iter().map(|c| Some(c.as_bytes())).collect();
        let t = vec![types::DATETIME; cells.len()];
        b.literals(&row, &t)
    }

    /// A two-sided range read from a day rollup with an hour rollup at its edges.
    fn day_and_hour() -> Bounds {
        Bounds {
            lower: true,
            upper: true,
            levels: vec![Bucket::Day, Bucket::Hour],
        }
    }

    fn ts(s: &str) -> String {
        format!("TIMESTAMP'{s}.000000'")
    }

    #[test]
    fn datetimes_parse_round_and_print() {
        assert_eq!(Wall::parse(b"2026-02-29 00:00:00"), None);
        assert_eq!(Wall::parse(b"0000-00-00 00:00:00"), None);
        assert_eq!(
            Wall::parse(b"2026-11-19 18:24:13.5").map(|w| w.us % 1_000_000),
            Some(500_000)
        );
        let w = Wall::parse(b"9999-12-31 23:59:59.999999").unwrap();
        assert_eq!(w.ceil(Bucket::Hour).literal(), None);
        assert_eq!(
            Wall::parse(b"2024-02-28 23:30:00")
                .unwrap()
                .round(Bucket::Hour)
                .literal()
                .unwrap(),
            ts("2024-02-29 00:00:00")
        );
    }

    #[test]
    fn boundaries_are_the_nearest_and_upper_bounds_at_now_round_up() {
        let b = day_and_hour();
        let got = lits(
            &b,
            &[
                "2026-11-19 18:24:13",
                "2026-11-26 18:24:13",
                "2026-11-26 18:24:13",
            ],
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                ts("2026-11-19 18:24:13"),
                ts("2026-11-26 18:24:13"),
                ts("2026-11-20 00:00:00"),
                ts("2026-11-27 00:00:00"),
                ts("2026-11-19 18:00:00"),
                ts("2026-11-26 19:00:00"),
            ]
        );
        // An upper bound in the past rounds to the nearest.
        let got = lits(
            &b,
            &[
                "2026-11-01 10:40:00",
                "2026-11-05 13:20:00",
                "2026-11-26 18:00:00",
            ],
        )
        .unwrap();
        assert_eq!(got[3], ts("2026-11-06 00:00:00"));
        assert_eq!(got[5], ts("2026-11-05 13:00:00"));
    }

    #[test]
    fn levels_without_a_whole_bucket_take_equal_boundaries() {
        let b = day_and_hour();
        // Within one hour: every level's pair is the lower bound.
        let got = lits(
            &b,
            &[
                "2026-11-01 10:05:00",
                "2026-11-01 10:25:00",
                "2026-11-26 00:00:00",
            ],
        )
        .unwrap();
        assert!(
            got[2..].iter().all(|l| *l == ts("2026-11-01 10:05:00")),
            "{got:?}"
        );
        // Within one day: the day pair is the lower hour boundary.
        let got = lits(
            &b,
            &[
                "2026-11-01 10:00:00",
                "2026-11-01 14:00:00",
                "2026-11-26 00:00:00",
            ],
        )
        .unwrap();
        assert_eq!(
            &got[2..4],
            &[ts("2026-11-01 10:00:00"), ts("2026-11-01 10:00:00")]
        );
        // Empty ranges, NULLs, other types and zero dates are declined.
        assert_eq!(
            lits(
                &b,
                &[
                    "2026-11-01 10:00:00",
                    "2026-11-01 10:00:00",
                    "2026-11-26 00:00:00"
                ]
            ),
            None
        );
        let row: Vec<Option<&[u8]>> = vec![
            Some(b"2026-11-01 10:00:00"),
            None,
            Some(b"2026-11-26 00:00:00"),
        ];
        assert_eq!(b.literals(&row, &[types::DATETIME; 3]), None);
        let row: Vec<Option<&[u8]>> = vec![
            Some(b"2026-11-01"),
            Some(b"2026-11-02"),
            Some(b"2026-11-26 00:00:00"),
        ];
        assert_eq!(
            b.literals(&row, &[types::DATE, types::DATE, types::DATETIME]),
            None
        );
        assert_eq!(
            lits(
                &b,
                &[
                    "0000-00-00 00:00:00",
                    "2026-11-01 10:00:00",
                    "2026-11-26 00:00:00"
                ]
            ),
            None
        );
    }

    #[test]
    fn one_sided_ranges() {
        let b = Bounds {
            lower: true,
            upper: false,
            levels: vec![Bucket::Hour],
        };
        assert_eq!(
            lits(&b, &["2026-11-19 18:44:13"]).unwrap(),
            vec![ts("2026-11-19 18:44:13"), ts("2026-11-19 19:00:00")]
        );
        let b = Bounds {
            lower: false,
            upper: true,
            levels: vec![Bucket::Day],
        };
        assert_eq!(
            lits(&b, &["2026-11-19 18:44:13", "2026-11-19 18:44:13"]).unwrap(),
            vec![ts("2026-11-19 18:44:13"), ts("2026-11-20 00:00:00")]
        );
    }
}
