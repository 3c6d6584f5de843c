"""Events as data (docs/api.md, "Events, seat maps and prices").

The events that exist were on sale (there was no other state): they stay so,
and new ones start as drafts. Their currency is their seats'. A price
category lives with its event's rows under Citus: its primary key is
(id, event_id) in the database, as 0008 made the others'.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from django.db.models import OuterRef, Subquery, Value
from django.db.models.functions import Coalesce


def currency_from_seats(apps, schema_editor):
    Event = apps.get_model("purchases", "Event")
    Seat = apps.get_model("purchases", "Seat")
    Event.objects.update(
        currency=Coalesce(
            Subquery(Seat.objects.filter(event=OuterRef("pk")).values("currency")[:1]),
            Value("EUR"),
        )
    )


class Migration(migrations.Migration):

    dependencies = [
        ('organizers', '0001_initial'),
        ('purchases', '0011_event_organizer_required'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='PriceCategory',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('code', models.CharField(max_length=32)),
                ('name', models.CharField(max_length=100)),
                ('price_amount', models.PositiveIntegerField()),
                ('currency', models.CharField(max_length=3)),
            ],
            options={
                'verbose_name_plural': 'price categories',
                'ordering': ['event', 'id'],
            },
        ),
        migrations.AddField(
            model_name='event',
            name='buyer_can_cancel_until',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='event',
            name='cancel_fee_percent',
            field=models.PositiveSmallIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='event',
            name='currency',
            field=models.CharField(default='EUR', max_length=3),
            preserve_default=False,
        ),
        migrations.RunPython(currency_from_seats, migrations.RunPython.noop),
        migrations.AddField(
            model_name='event',
            name='hold_seconds',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='event',
            name='max_seats_per_buyer',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='event',
            name='published_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='event',
            name='sales_end',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='event',
            name='sales_start',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='event',
            name='status',
            field=models.CharField(choices=[('draft', 'Draft'), ('on_sale', 'On Sale'), ('cancelled', 'Cancelled')], default='on_sale', max_length=10),
        ),
        migrations.AlterField(
            model_name='event',
            name='status',
            field=models.CharField(choices=[('draft', 'Draft'), ('on_sale', 'On Sale'), ('cancelled', 'Cancelled')], default='draft', max_length=10),
        ),
        migrations.AddField(
            model_name='seat',
            name='accessible',
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name='seat',
            name='block_reason',
            field=models.CharField(blank=True, default='', max_length=200),
        ),
        migrations.AddField(
            model_name='seat',
            name='category',
            field=models.CharField(blank=True, default='', max_length=32),
        ),
        migrations.AddField(
            model_name='seat',
            name='section',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
        migrations.AddField(
            model_name='seat',
            name='x',
            field=models.FloatField(default=0),
        ),
        migrations.AddField(
            model_name='seat',
            name='y',
            field=models.FloatField(default=0),
        ),
        migrations.AlterField(
            model_name='seat',
            name='ref',
            field=models.CharField(max_length=32),
        ),
        migrations.AlterField(
            model_name='seat',
            name='row',
            field=models.CharField(max_length=16),
        ),
        migrations.AlterField(
            model_name='seat',
            name='status',
            field=models.CharField(choices=[('available', 'Available'), ('held', 'Held'), ('sold', 'Sold'), ('unavailable', 'Unavailable')], default='available', max_length=11),
        ),
        migrations.AddIndex(
            model_name='reservation',
            index=models.Index(fields=['event', 'buyer'], name='reservation_event_buyer_idx'),
        ),
        migrations.AddConstraint(
            model_name='event',
            constraint=models.CheckConstraint(condition=models.Q(('cancel_fee_percent__lte', 100)), name='event_fee_percent_at_most_100'),
        ),
        migrations.AddConstraint(
            model_name='event',
            constraint=models.CheckConstraint(condition=models.Q(('sales_start__isnull', True), ('sales_end__isnull', True), ('sales_start__lt', models.F('sales_end')), _connector='OR'), name='event_sales_window_in_order'),
        ),
        migrations.AddField(
            model_name='pricecategory',
            name='event',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='price_categories', to='purchases.event'),
        ),
        migrations.AddConstraint(
            model_name='pricecategory',
            constraint=models.UniqueConstraint(fields=('event', 'code'), name='price_category_code_per_event'),
        ),
        migrations.RunSQL(
            "ALTER TABLE purchases_pricecategory DROP CONSTRAINT purchases_pricecategory_pkey,"
            " ADD CONSTRAINT purchases_pricecategory_pkey PRIMARY KEY (id, event_id)",
            "ALTER TABLE purchases_pricecategory DROP CONSTRAINT purchases_pricecategory_pkey,"
            " ADD CONSTRAINT purchases_pricecategory_pkey PRIMARY KEY (id)",
        ),
    ]
