"""`python -m kvrepro.calibration CAMPAIGN_DIR OUT_YAML [STATED_YAML]`: fit the twin to a live
campaign and write the fitted server spec, its LMCache tiers as STATED_YAML (else OUT_YAML if
it exists, else the shipped cpu_tiny.yaml) states them (`kvrepro.calibration.profile_yaml.main`)."""

from kvrepro.calibration.profile_yaml import main

if __name__ == "__main__":
    main()
