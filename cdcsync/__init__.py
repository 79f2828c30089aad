"""cdcsync: Debezium changelogs from Kafka through Spark into exactly-equal Postgres and ClickHouse targets."""

__version__ = "0.1.0"
