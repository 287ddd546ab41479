"""Migration counters parsed from Prometheus text as Dynamo's frontend writes it."""

from handoff.metrics import MigrationCounts, sample_sum

FRONTEND_AFTER_MIGRATION = """\
# HELP dynamo_frontend_model_migration_total Total number of request migrations
# TYPE dynamo_frontend_model_migration_total counter
dynamo_frontend_model_migration_total{migration_type="ongoing_request",model="m"} 1
dynamo_frontend_model_migration_total{migration_type="new_request",model="other"} 4
# TYPE dynamo_frontend_model_migration_duration_seconds histogram
dynamo_frontend_model_migration_duration_seconds_bucket{migration_type="ongoing_request",model="m",outcome="failure",le="+Inf"} 1
dynamo_frontend_model_migration_duration_seconds_sum{migration_type="ongoing_request",model="m",outcome="failure"} 0.001
dynamo_frontend_model_migration_duration_seconds_count{migration_type="ongoing_request",model="m",outcome="failure"} 1
# TYPE dynamo_frontend_model_migration_max_seq_len_exceeded_total counter
dynamo_frontend_model_migration_max_seq_len_exceeded_total{model="m"} 1
"""


def test_counts_for_one_model():
    counts = MigrationCounts.parse(FRONTEND_AFTER_MIGRATION, "m")
    assert counts == MigrationCounts(
        ongoing_request=1, new_request=0, max_seq_len_exceeded=1, succeeded=0, failed=1
    )


def test_absent_series_count_as_zero():
    assert MigrationCounts.parse("", "m") == MigrationCounts(0, 0, 0, 0, 0)


def test_sample_sum_matches_labels_subset():
    text = FRONTEND_AFTER_MIGRATION
    assert sample_sum(text, "dynamo_frontend_model_migration_total") == 5
    assert sample_sum(text, "dynamo_frontend_model_migration_total", {"model": "other"}) == 4
