"""Payload bytes: the serializer registry, Akka's serializers, compression and encryption."""
