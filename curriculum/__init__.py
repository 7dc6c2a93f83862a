"""Curriculum: the stats store, the scheduler, mixing policies and difficulty control."""
