-- Example schema for scripts/demo.sh: a legacy "page hits" counter table.
CREATE DATABASE IF NOT EXISTS demo;
CREATE USER IF NOT EXISTS 'demo'@'%' IDENTIFIED BY 'demo';
GRANT ALL ON demo.* TO 'demo'@'%';
USE demo;
CREATE TABLE IF NOT EXISTS hits (
  slug VARCHAR(64) NOT NULL PRIMARY KEY,
  cnt INT NOT NULL DEFAULT 0,
  note VARCHAR(100) NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
INSERT IGNORE INTO hits (slug, cnt, note) VALUES ('home', 0, 'front page'), ('about', 0, NULL);
