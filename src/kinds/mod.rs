//! Rule kinds: one folder per kind, each owning its whole life.

pub mod counter;
pub mod ring;
