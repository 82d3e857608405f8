"""The two tables of the orders services (made by app.py's SCHEMA, as every example
makes them, so the models are unmanaged: no migrations)."""

from django.db import models
from django.db.models.functions import Now


class Order(models.Model):
    """orders: one row per order the service took."""

    id = models.BigAutoField(primary_key=True)
    principal = models.TextField()
    item = models.TextField()
    quantity = models.IntegerField()
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        managed = False
        db_table = "orders"
        app_label = "shop"


class ApiKey(models.Model):
    """api_keys: one row per API key handed out (its secret is never stored)."""

    id = models.BigAutoField(primary_key=True)
    principal = models.TextField()
    name = models.TextField()
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        managed = False
        db_table = "api_keys"
        app_label = "shop"
