"""`python -m kvrepro.calibration CAMPAIGN_DIR OUT_YAML`: fit the twin to a live campaign and
write the fitted server spec (`kvrepro.calibration.profile_yaml.main`)."""

from kvrepro.calibration.profile_yaml import main

if __name__ == "__main__":
    main()
