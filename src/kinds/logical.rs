//! The logical table, as kinds see it: what every kind needs to know about the table
//! the application names, shared instead of re-written per kind.
//!
//! - [`LogicalTable`]: the table a rule is about — its name and key columns,
//!   whether a statement's table reference names it, its columns (learned from the
//!   server once per database), and where its physical tables are.
//! - [`assumed_column`]: the column definitions a kind plans with when no database
//!   can be asked (`check` and `explain` without `--backend-url`).
//!
//! The statement-shape guards every kind applies (multi-table UPDATE/DELETE, DDL,
//! unrecognised clauses, qualifiers) and the `k = value AND …` key predicates are in
//! [`crate::rewrite::shape`].

use std::sync::Arc;

use sqlparser::ast::{ObjectName, TableFactor};

use crate::rewrite::shape::{eq, ColumnsByDb};
use crate::rewrite::{PlanContext, Refusal, TableName};
use crate::rules::spec::quote;
use crate::wire::resultset::{types, ColumnDef};

/// The table a rule is about, as its planner sees it.
pub struct LogicalTable {
    /// The table (one entry: [`crate::rewrite::Rule::tables`] returns a slice).
    tables: [TableName; 1],
    /// Key columns, as configured (compared ASCII case-insensitively).
    key: Vec<String>,
    /// Its columns, learned once per database.
    meta: ColumnsByDb,
}

impl LogicalTable {
    /// The table `table` with key columns `key`.
    pub fn new(table: TableName, key: Vec<String>) -> Self {
        LogicalTable {
            meta: ColumnsByDb::new(table.clone()),
            tables: [table],
            key,
        }
    }

    /// The table's name as the rule wrote it.
    pub fn name(&self) -> &TableName {
        &self.tables[0]
    }

    /// The table, as [`crate::rewrite::Rule::tables`] returns it.
    pub fn tables(&self) -> &[TableName] {
        &self.tables
    }

    /// The key columns, as configured.
    pub fn key(&self) -> &[String] {
        &self.key
    }

    /// Whether `col` is a key column.
    pub fn is_key(&self, col: &str) -> bool {
        self.key.iter().any(|k| eq(k, col))
    }

    /// Whether `name`, in a statement, names this table.
    pub fn named_by(&self, name: &ObjectName, ctx: &PlanContext<'_>) -> bool {
        ctx.names_table(name, &self.tables[0])
    }

    /// Whether a FROM item is this table (not a derived table, a function, …).
    pub fn is_factor(&self, f: &TableFactor, ctx: &PlanContext<'_>) -> bool {
        matches!(f, TableFactor::Table { name, .. } if self.named_by(name, ctx))
    }

    /// The table's columns in the statement's database, once learned.
    pub fn columns(&self, ctx: &PlanContext<'_>) -> Result<Arc<Vec<ColumnDef>>, Refusal> {
        self.meta.get(ctx.table_db(&self.tables[0]))
    }

    /// The query that learns the columns ([`crate::rewrite::Rule::metadata_query`]).
    pub fn metadata_query(&self, current_db: Option<&str>) -> Option<String> {
        self.meta.query(current_db)
    }

    /// Receives the columns ([`crate::rewrite::Rule::provide_metadata`]).
    pub fn provide_metadata(&self, current_db: Option<&str>, columns: &[ColumnDef]) {
        self.meta.provide(current_db, columns);
    }

    /// The table a merged write of a statement on this table writes: `physical` (this
    /// table itself for a log) in the database its SQL name resolves to
    /// ([`LogicalTable::physical_sql`]); `expects_own_trigger` when heatsink's own
    /// trigger is on it.
    pub fn merge_table(
        &self,
        physical: &TableName,
        ctx: &PlanContext<'_>,
        expects_own_trigger: bool,
    ) -> Option<crate::rewrite::MergeTable> {
        let db = physical
            .db
            .as_deref()
            .or_else(|| ctx.table_db(&self.tables[0]));
        crate::rewrite::MergeTable::new(db, &physical.name, expects_own_trigger)
    }

    /// A physical table's SQL name: as the rule wrote it when that names a database,
    /// else qualified like the statement's reference `logical` to this table (so it
    /// lives next to the logical table the statement meant).
    pub fn physical_sql(&self, physical: &TableName, logical: &ObjectName) -> String {
        if physical.db.is_some() || logical.0.len() < 2 {
            return physical.quoted();
        }
        format!("{}.{}", logical.0[0], quote(&physical.name))
    }
}

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
