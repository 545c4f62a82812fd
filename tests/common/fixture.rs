//! The counter fixture several test files share: a database with the logical table
//! `hits(slug, cnt)`, its slot table and the trigger `heatsink migrate` creates, and
//! the rule that names them.

use super::mariadb;

/// The counter rule `name` on table `hits` (unqualified), key `slug`, 4 slots.
pub fn counter_rule(name: &str) -> String {
    format!(
        r#"[[counter]]
name = "{name}"
table = "hits"
key = ["slug"]
columns = ["cnt"]
slots = 4
slot_table = "hits_slots"
"#
    )
}

/// Creates database `db` afresh with `hits (slug VARCHAR(64) PRIMARY KEY, cnt INT)`,
/// `hits_slots` and its trigger, both tables with `table_options` (for example a
/// character set and collation), and inserts `rows` into `hits` (`('home', 10), …`).
pub fn create_counter_db(db: &str, table_options: &str, rows: &str) {
    mariadb().exec(&format!(
        "DROP DATABASE IF EXISTS {db}; CREATE DATABASE {db} CHARACTER SET utf8mb4; USE {db};
         CREATE TABLE hits (slug VARCHAR(64) PRIMARY KEY, cnt INT NOT NULL DEFAULT 0) {table_options};
         CREATE TABLE hits_slots (slug VARCHAR(64) NOT NULL, slot SMALLINT UNSIGNED NOT NULL,
             cnt BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (slug, slot)) {table_options};
         CREATE TRIGGER hits_slots_hs_ai AFTER INSERT ON hits_slots FOR EACH ROW
             INSERT IGNORE INTO hits (slug) VALUES (NEW.slug);
         INSERT INTO hits VALUES {rows};"
    ));
}
