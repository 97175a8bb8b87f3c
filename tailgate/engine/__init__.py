"""Scheduling: queues, roster, pages, the door. Plain Python; never imports torch."""
