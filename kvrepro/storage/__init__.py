"""Storage characterisation with fio: the flash tier measured on this machine's drives.

* `fio`: job files for a sweep (request size, I/O depth, jobs, engine, read/write, direct
  I/O, several targets), runs on files or devices the user names, raw output kept;
* `parse`: fio's JSON report and per-I/O latency logs, I/Os in flight over time;
* `profile`: a sweep turned into the simulator's flash-tier parameters (a measured profile
  YAML for `kvrepro run sim --flash-profile`), and DRAM copy timing for B9;
* `endurance_traffic`: DWPD and years to rated endurance from a measured, simulated or
  traced write rate.
"""
