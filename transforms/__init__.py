"""Transforms: filter chains that read input topics and write an output topic.

See docs/TRANSFORMS.md.
"""
