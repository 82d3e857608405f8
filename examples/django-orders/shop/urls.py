"""The routes of every orders service (examples/orders-service is the reference)."""

from django.urls import path

from . import views

urlpatterns = [
    path("health", views.health),
    path("orders/count", views.count),
    path("orders", views.orders),
    path("reject/orders", views.orders),
    path("classic/orders", views.orders),
    path("flaky/orders", views.flaky_orders),
    path("plain/orders", views.plain_orders),
    path("api-keys", views.api_keys),
    path("orders/stream", views.stream),
]

handler404 = "shop.views.not_found"
