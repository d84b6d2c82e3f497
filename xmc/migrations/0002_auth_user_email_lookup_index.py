"""Index the case-insensitive email lookup every authenticated request makes.

`xmc.auth.identity.identity_for_email` filters ``auth_user`` by
``email__iexact``, which Django compiles to ``UPPER(email::text) = UPPER(%s)``
on PostgreSQL. Without an expression index that is a sequential scan of the
user table on every RPC. The index belongs to Django's table, so it is created
with SQL here rather than declared on a model we do not own.
"""
from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("xmc", "0001_cli_authorization_code"),
    ]

    operations = [
        migrations.RunSQL(
            sql='CREATE INDEX IF NOT EXISTS "xmc_auth_user_upper_email_idx" ON "auth_user" (UPPER("email"::text))',
            reverse_sql='DROP INDEX IF EXISTS "xmc_auth_user_upper_email_idx"',
        ),
    ]
