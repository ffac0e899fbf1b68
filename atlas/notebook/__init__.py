"""What the notebooks show: tables and request bodies (`display`), figures (`plots`), the memory
inspector widget (`inspector`) and the papermill runner behind `atlas notebooks` (`runner`)."""
