//! The logical table, as kinds see it: what every kind needs to know about the table
//! the application names, shared instead of re-written per kind.
//!
//! - [`assumed_column`]: the column definitions a kind plans with when no database
//!   can be asked (`check` and `explain` without `--backend-url`).

use crate::wire::resultset::{types, ColumnDef};

/// Column shapes [`assumed_column`] builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assumed {
    /// `VARCHAR(255) NOT NULL`, utf8mb4, part of the primary key.
    Key,
    /// `BIGINT NOT NULL`.
    Integer,
    /// `DATETIME(6)`.
    Time,
}

/// `MYSQL_TYPE_VAR_STRING`, the type byte of a VARCHAR column in a result set.
const VAR_STRING: u8 = 0xfd;
/// Column flags: NOT NULL, PRIMARY KEY, numeric.
const NOT_NULL_FLAG: u16 = 0x0001;
const PRI_KEY_FLAG: u16 = 0x0002;
const NUM_FLAG: u16 = 0x8000;
/// Collation ids: utf8mb4_general_ci, binary.
const UTF8MB4: u16 = 45;
const BINARY: u16 = 63;

/// A plausible definition of column `name` of `table` with the given shape.
pub fn assumed_column(table: &str, name: &str, kind: Assumed) -> ColumnDef {
    let (column_type, charset, length, flags, decimals) = match kind {
        Assumed::Key => (
            VAR_STRING,
            UTF8MB4,
            255 * 4,
            NOT_NULL_FLAG | PRI_KEY_FLAG,
            0,
        ),
        Assumed::Integer => (types::LONGLONG, BINARY, 20, NOT_NULL_FLAG | NUM_FLAG, 0),
        Assumed::Time => (types::DATETIME, BINARY, 26, 0, 6),
    };
    ColumnDef {
        catalog: b"def".to_vec(),
        schema: Vec::new(),
        table: table.as_bytes().to_vec(),
        org_table: table.as_bytes().to_vec(),
        name: name.as_bytes().to_vec(),
        org_name: name.as_bytes().to_vec(),
        extended: None,
        charset,
        length,
        column_type,
        flags,
        decimals,
        fixed_len: 0x0c,
        tail: vec![0, 0],
    }
}
