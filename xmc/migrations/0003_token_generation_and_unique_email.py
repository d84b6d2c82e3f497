"""Token generations (revocation) and one normalized, unique email per Django user.

Existing emails are rewritten to their normalized form
(`xmc.auth.identity.normalize_email`, inlined here as migrations must not
import application code that may change); two users whose emails normalize
to the same string stop the migration with the list, for an operator to
resolve. Then a unique index on ``auth_user.email`` (non-empty) replaces the
``UPPER(email)`` index of 0002: lookups are exact now.
"""
import unicodedata

from django.db import migrations, models


def _normalize(email):
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", email.strip()).casefold())


def normalize_emails(apps, schema_editor):
    User = apps.get_model("auth", "User")
    seen = {}
    clashes = []
    for pk, email in User.objects.exclude(email="").order_by("pk").values_list("pk", "email"):
        normalized = _normalize(email)
        if normalized in seen:
            clashes.append(f"{normalized} (users {seen[normalized]} and {pk})")
            continue
        seen[normalized] = pk
        if normalized != email:
            User.objects.filter(pk=pk).update(email=normalized)
    if clashes:
        raise RuntimeError("users share an email once normalized; give each a distinct email first: "
                           + ", ".join(clashes))



class Migration(migrations.Migration):

    dependencies = [
        ('xmc', '0002_auth_user_email_lookup_index'),
    ]

    operations = [
        migrations.RunPython(normalize_emails, migrations.RunPython.noop),
        migrations.RunSQL(
            sql='CREATE UNIQUE INDEX "xmc_auth_user_email_unique" ON "auth_user" ("email") WHERE "email" <> \'\'',
            reverse_sql='DROP INDEX IF EXISTS "xmc_auth_user_email_unique"',
        ),
        migrations.RunSQL(
            sql='DROP INDEX IF EXISTS "xmc_auth_user_upper_email_idx"',
            reverse_sql='CREATE INDEX IF NOT EXISTS "xmc_auth_user_upper_email_idx" ON "auth_user" (UPPER("email"::text))',
        ),
        migrations.CreateModel(
            name='TokenGeneration',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('email', models.CharField(help_text='NFKC + casefolded email', max_length=320, unique=True)),
                ('generation', models.PositiveIntegerField(default=0)),
                ('changed_at', models.DateTimeField()),
                ('reason', models.CharField(blank=True, default='', max_length=64)),
            ],
        ),
    ]
