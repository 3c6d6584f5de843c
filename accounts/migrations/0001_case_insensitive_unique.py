"""One account per username and per email address, whatever their case, as
a constraint (accounts/services.py maps its violation to a 400 naming the
field): Django's auth_user has a unique username, case-sensitive, and no
rule at all on the email. The expressions are the ones Django's ``iexact``
compares (``UPPER(col::text)``), so that the sign-up's look-up uses them too.
The email's index leaves out the empty address (users made without one: the
admin's, the benchmark's). On a database that already holds two accounts
differing only in case, this migration fails: merge or rename them first."""

from django.db import migrations

USERNAME = "accounts_user_username_upper_uniq"
EMAIL = "accounts_user_email_upper_uniq"


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [
        migrations.RunSQL(
            f'CREATE UNIQUE INDEX "{USERNAME}" ON "auth_user" (UPPER("username"::text))',
            f'DROP INDEX "{USERNAME}"',
        ),
        migrations.RunSQL(
            f'CREATE UNIQUE INDEX "{EMAIL}" ON "auth_user" (UPPER("email"::text))'
            " WHERE \"email\" <> ''",
            f'DROP INDEX "{EMAIL}"',
        ),
    ]
