-- heatsink's health checker reads wsrep_ready and wsrep_local_state_comment with
-- SHOW GLOBAL STATUS, which needs no privilege. Its password is the default of
-- HEATSINK_HEALTH_PASSWORD in ../compose.cluster.yaml: change both together.
CREATE USER IF NOT EXISTS 'heatsink_health'@'%' IDENTIFIED BY 'health-check';
