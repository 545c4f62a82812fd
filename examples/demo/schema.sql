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
-- A "last visitors" log that is only ever read for the latest few rows per profile.
CREATE TABLE IF NOT EXISTS profile_visits_log (
  id INT AUTO_INCREMENT PRIMARY KEY,
  uid INT NOT NULL,
  visitor_uid INT NOT NULL,
  last_update DATETIME(6) NOT NULL,
  KEY (uid)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
INSERT INTO profile_visits_log (uid, visitor_uid, last_update)
  SELECT 5, seq, NOW(6) - INTERVAL seq MINUTE FROM seq_1_to_20
  WHERE NOT EXISTS (SELECT 1 FROM profile_visits_log);
-- A play log the application appends to on every play and aggregates for statistics.
CREATE TABLE IF NOT EXISTS plays (
  id BIGINT AUTO_INCREMENT PRIMARY KEY,
  created_at DATETIME DEFAULT NULL,
  track_id INT DEFAULT NULL,
  user_id INT DEFAULT NULL,
  referer TEXT,
  country VARCHAR(255) DEFAULT NULL,
  api_consumer_key VARCHAR(255) DEFAULT NULL,
  KEY (track_id), KEY (user_id), KEY (created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
INSERT INTO plays (created_at, track_id, user_id, country)
  SELECT NOW() - INTERVAL seq * 7 MINUTE, 1 + seq % 5, seq % 100, ELT(1 + seq % 4, 'US', 'DE', 'FR', 'BR')
  FROM seq_1_to_5000
  WHERE NOT EXISTS (SELECT 1 FROM plays);

-- [[timeline]] (rules/timelines.toml): follows and messages for friends timelines.
CREATE TABLE IF NOT EXISTS follower (
  user_id INT UNSIGNED NOT NULL,
  follower_id INT UNSIGNED NOT NULL,
  PRIMARY KEY (user_id, follower_id),
  KEY (follower_id)
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS message (
  id INT UNSIGNED AUTO_INCREMENT PRIMARY KEY,
  user_id INT UNSIGNED NOT NULL,
  body VARCHAR(255) NOT NULL,
  KEY user_id_id (user_id, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
INSERT IGNORE INTO follower SELECT 1 + seq DIV 20, 1 + (seq * 37) % 100 FROM seq_0_to_1999;
INSERT INTO message (user_id, body)
  SELECT 1 + seq % 100, CONCAT('message ', seq) FROM seq_1_to_20000
  WHERE NOT EXISTS (SELECT 1 FROM message);

-- [[partition]] (rules/partitions.toml): rows looked up by a key that carries its
-- creation time (unix seconds between dashes). `heatsink migrate --apply`
-- partitions the table by day and installs the triggers that keep `Inserted` within
-- a day of the key's date.
CREATE TABLE IF NOT EXISTS Messages (
  ID BIGINT AUTO_INCREMENT,
  UUID VARCHAR(40) NOT NULL,
  Message JSON NOT NULL,
  Inserted DATE NOT NULL,
  PRIMARY KEY (ID, Inserted),
  UNIQUE KEY (UUID, Inserted)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
INSERT INTO Messages (UUID, Message, Inserted)
  SELECT CONCAT(LPAD(HEX(seq), 10, '0'), '-', UNIX_TIMESTAMP(NOW() - INTERVAL seq HOUR), '-', LPAD(HEX(seq * 7919), 10, '0')),
         JSON_OBJECT('n', seq), DATE(NOW() - INTERVAL seq HOUR)
  FROM seq_1_to_500
  WHERE NOT EXISTS (SELECT 1 FROM Messages);
