# GENERATED CODE: written by flatbuffers/generate.py from flatbuffers/barrage.fbs with flatc version 2.0.8. Do not edit.
