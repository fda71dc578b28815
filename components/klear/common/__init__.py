"""Code shared by every stage: storage URIs, record readers and writers, typed configs."""
